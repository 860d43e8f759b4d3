"""Forward rules of the ops linear in their data (views, gathers, sums, average pools, resizes: the same
op applied to the tangent) and of the multilinear ones (MatMul, Gemm, Conv, ConvTranspose, Einsum: one
term per operand that carries a tangent, the others as they are)."""
from __future__ import annotations

from onnx import helper

from ..context import attr
from .core import full
from .registry import jvp_rule


def again(ctx, node, inputs) -> list[str | None]:
    """The node's own op and attributes over other inputs, with fresh output names (None where it has none)."""
    hint = f"{node.name or node.op_type}/{node.op_type}"
    outs = [ctx.fresh(hint) if o else "" for o in node.output]
    copy = helper.make_node(node.op_type, list(inputs), outs, name=ctx.fresh(f"{hint}_node"), domain=node.domain)
    copy.attribute.extend(node.attribute)
    ctx.nodes.append(copy)
    return [o or None for o in outs]


@jvp_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Slice", "Gather", "GatherElements",
          "GatherND", "Tile", "DepthToSpace", "SpaceToDepth", "ReduceSum", "ReduceMean", "AveragePool",
          "GlobalAveragePool", "CumSum", "Resize", "Split", "Compress", "Trilu", "ReverseSequence")
def same_op(ctx, node, ins):
    """Linear in input 0, the rest (shapes, indices, axes, scales) held: the op itself maps the tangent."""
    if ins[0] is None or any(t is not None for t in ins[1:]):
        return NotImplemented  # a tangent through a float roi or scales: the backward rule transposed says
    return again(ctx, node, [ins[0]] + list(node.input[1:]))


@jvp_rule("Pad")
def pad(ctx, node, ins):
    """Pad's padding is constant_value (its tangent 0) or copies of the input (the same copies of the tangent)."""
    if ins[0] is None or any(t is not None for t in ins[1:]):
        return NotImplemented
    inputs = list(node.input)
    if len(inputs) > 2:
        inputs[2] = ""  # constant mode pads the tangent with 0; the other modes ignore the value
    return again(ctx, node, [ins[0]] + inputs[1:])


@jvp_rule("Concat")
def concat(ctx, node, ins):
    parts = [t if t is not None else ctx.fill_like(x, 0.0) for x, t in zip(node.input, ins)]
    return again(ctx, node, parts)


def _terms(ctx, node, ins, operands) -> list[str]:
    """One application of the node's op per operand i in `operands` that carries a tangent: its tangent in
    place of operand i, every other operand of `operands` as it is (optional ones after them dropped)."""
    terms = []
    for i in operands:
        if i < len(ins) and ins[i] is not None:
            inputs = [ins[k] if k == i else node.input[k] for k in operands]
            terms.append(again(ctx, node, inputs)[0])
    return terms


@jvp_rule("MatMul", "Einsum")
def matmul(ctx, node, ins):
    return [ctx.add_all(_terms(ctx, node, ins, range(len(node.input))))]


@jvp_rule("Gemm")
def gemm(ctx, node, ins):
    """alpha·(tA B + A tB) + beta·tC, transposes as the node says."""
    terms = _terms(ctx, node, ins, (0, 1))
    if len(ins) > 2 and ins[2] is not None:
        y, c = node.output[0], node.input[2]
        scaled = ctx.op("Mul", [ins[2], ctx.scalar(float(attr(node, "beta", 1.0)), y)])
        terms.append(scaled if terms else full(ctx, scaled, y, c))
    return [ctx.add_all(terms)]


@jvp_rule("Conv", "ConvTranspose")
def conv(ctx, node, ins):
    """op(tX, W) + op(X, tW) + tB, the bias tangent along the channel axis."""
    terms = _terms(ctx, node, ins, (0, 1))
    if len(ins) > 2 and ins[2] is not None:
        y = node.output[0]
        bias = ctx.op("Reshape", [ins[2], ctx.ints([1, -1] + [1] * (ctx.need_rank(y) - 2))])
        terms.append(bias if terms else ctx.op("Expand", [bias, ctx.op("Shape", [y])]))
    return [ctx.add_all(terms)]


@jvp_rule("BatchNormalization")
def batch_norm(ctx, node, ins):
    """Inference mode, linear in X (about the mean), in scale and in B: BatchNormalization of tX with bias
    and mean 0, of X with scale tscale and bias 0, and tB along the channels. Running statistics are held."""
    if attr(node, "training_mode", 0) or len([o for o in node.output if o]) > 1 or any(t is not None for t in ins[3:]):
        return NotImplemented
    x, scale, bias, mean, var = node.input[:5]
    zero_bias = ctx.fill_like(bias, 0.0)
    terms = []
    if ins[0] is not None:
        terms.append(again(ctx, node, [ins[0], scale, zero_bias, ctx.fill_like(mean, 0.0), var])[0])
    if ins[1] is not None:
        terms.append(again(ctx, node, [x, ins[1], zero_bias, mean, var])[0])
    if ins[2] is not None:
        y = node.output[0]
        shift = ctx.op("Reshape", [ins[2], ctx.ints([1, -1] + [1] * (ctx.need_rank(y) - 2))])
        terms.append(shift if terms else ctx.op("Expand", [shift, ctx.op("Shape", [y])]))
    return [ctx.add_all(terms)]
