"""Standard ops that onnxruntime (1.32) has no kernel for, written out before lowering in ops it runs.

The lowered model is ours: where a forward node would stop a runtime from running it, it is replaced by
its definition at the model's own opset (nothing is downgraded), and the backward rules differentiate
that definition. Each expansion writes the node's own output names, so selections naming them resolve.

- Swish (24): x · Sigmoid(alpha · x).
- SwiGLU (28) and ai.onnx.preview's FlexAttention: their ONNX function bodies (SwiGLU's Swish in turn).
- DequantizeLinear (28): (x − zero point) · scale in Cast, Sub and Mul, per tensor, axis or block.
- OptionalGetElement (28) of a plain tensor: Identity.
- Pow with an exponent of an integer type onnxruntime has no kernel for (8- and 16-bit, unsigned):
  the exponent cast to int64.
- GRU, LSTM and RNN with layout 1 (batch first): Transposes around the same recurrence in layout 0.
- ai.onnx.preview.training's Momentum, Adagrad and Adam: their formulas (engine/lowering/training.py).
- A user's op of its own domain with an `expansion` (engine/lowering/registry.py): what it writes.
"""
from __future__ import annotations

import onnx
from onnx import ModelProto, NodeProto, TensorProto

from .context import Ctx, attr
from .decompose import function_body, inline
from .quantize import _along, _layout
from .registry import EXPANDED
from .rewrite import Expansion, drop_unused_domains, expand_nodes
from .training import DOMAIN as TRAINING
from .training import OPTIMIZERS

PREVIEW = "ai.onnx.preview"
POW_EXPONENTS = {TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def _since(ctx: Ctx, node: NodeProto) -> int:
    try:
        return onnx.defs.get_schema(node.op_type, ctx.opset, node.domain or "").since_version
    except onnx.defs.SchemaError:
        return 0


def _outputs(ctx: Ctx, node: NodeProto, values) -> None:
    for name, value in zip(node.output, values):
        if name and value:
            ctx.emit("Identity", [value], [name])


def swish(ctx: Ctx, node: NodeProto) -> None:
    x = node.input[0]
    gate = ctx.op("Sigmoid", [ctx.op("Mul", [x, ctx.scalar(attr(node, "alpha", 1.0), x)])])
    _outputs(ctx, node, [ctx.op("Mul", [x, gate])])


def body(ctx: Ctx, node: NodeProto) -> None:
    found = function_body(ctx, node)
    if found is None:
        raise ctx.error("onnx builds no function body for its attributes and input types, and onnxruntime "
                        "has no kernel for it")
    _outputs(ctx, node, inline(ctx, node, found))


def dequantize_linear(ctx: Ctx, node: NodeProto) -> None:
    """As the engine: (x − zero point) · scale computed in the scale's type widened to float32 at least."""
    x, scale = node.input[0], node.input[1]
    zero_point = node.input[2] if len(node.input) > 2 else ""
    rank = ctx.need_rank(x)
    axis, block = attr(node, "axis", 1) % max(rank, 1), attr(node, "block_size", 0)
    layout = _layout(ctx, node, scale)
    work = TensorProto.DOUBLE if ctx.elem(scale) == TensorProto.DOUBLE else TensorProto.FLOAT
    centered = ctx.op("Cast", [x], to=work)
    if zero_point:
        zp = ctx.op("Cast", [zero_point], to=work)
        centered = ctx.op("Sub", [centered, _along(ctx, zp, scale, x, layout, axis, block)])
    wide = ctx.op("Cast", [scale], to=work) if ctx.elem(scale) != work else scale
    y = ctx.op("Mul", [centered, _along(ctx, wide, scale, x, layout, axis, block)])
    out = attr(node, "output_dtype", 0) or ctx.elem(scale)
    _outputs(ctx, node, [ctx.op("Cast", [y], to=out) if out != work else y])


def identity(ctx: Ctx, node: NodeProto) -> None:
    _outputs(ctx, node, [ctx.op("Identity", [node.input[0]])])


def pow_(ctx: Ctx, node: NodeProto) -> None:
    base, exponent = node.input
    _outputs(ctx, node, [ctx.op("Pow", [base, ctx.op("Cast", [exponent], to=TensorProto.INT64)])])


def batch_first_recurrence(ctx: Ctx, node: NodeProto) -> None:
    """The recurrence in layout 0: X, initial_h and initial_c (batch first) transposed in, Y, Y_h and Y_c
    transposed back."""
    swap = [1, 0, 2]
    inputs = list(node.input)
    for k in (0, 5, 6):  # X, initial_h, initial_c
        if k < len(inputs) and inputs[k]:
            inputs[k] = ctx.op("Transpose", [inputs[k]], perm=swap)
    outputs = [ctx.fresh(f"{node.name or node.op_type}/layout0_{t}") if t else "" for t in node.output]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name != "layout"}
    ctx.emit(node.op_type, inputs, outputs, **attrs)
    back = [[2, 0, 1, 3], swap, swap]  # Y (seq, dirs, batch, hidden) to (batch, seq, dirs, hidden); Y_h, Y_c
    _outputs(ctx, node, [ctx.op("Transpose", [t], perm=perm) if t else "" for t, perm in zip(outputs, back)])


# op -> (the first version onnxruntime 1.32 has no kernel for, its expansion)
NEWER = {"Swish": (24, swish), "SwiGLU": (28, body), "DequantizeLinear": (28, dequantize_linear),
         "OptionalGetElement": (28, identity)}


def expansion_for(ctx: Ctx, node: NodeProto) -> Expansion | None:
    """The expansion a node needs to run in onnxruntime, or None when it runs as it is."""
    op, domain = node.op_type, node.domain or ""
    if domain == PREVIEW and op == "FlexAttention":
        return body
    if domain == TRAINING and op in OPTIMIZERS:
        return OPTIMIZERS[op]
    if (domain, op) in EXPANDED:
        return EXPANDED[(domain, op)]
    if domain not in ("", "ai.onnx"):
        return None
    if op in NEWER and _since(ctx, node) >= NEWER[op][0]:
        if op == "OptionalGetElement" and node.input[0] not in ctx.types:  # an optional: no other op unwraps it
            return None
        return NEWER[op][1]
    if op == "Pow" and len(node.input) == 2 and node.input[1] in ctx.types and ctx.elem(node.input[1]) not in POW_EXPONENTS:
        return pow_
    if op in ("GRU", "LSTM", "RNN") and attr(node, "layout", 0) == 1:
        return batch_first_recurrence
    return None


def make_portable(proto: ModelProto, weights=None, types=None, constants=None) -> bool:
    """Write out (in place) the nodes of proto's graph that onnxruntime cannot run; whether there were any.
    `types` and `constants`: the graph's tensor types and known values when known."""
    if not expand_nodes(proto, weights, expansion_for, "portable", types, constants):
        return False
    drop_unused_domains(proto, {PREVIEW})  # the training domain goes once its Gradient nodes are lowered
    return True
