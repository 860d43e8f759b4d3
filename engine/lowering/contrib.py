"""onnxruntime's contrib ops written out as ai.onnx ops before lowering: their definitions, so the
existing backward rules differentiate them and the lowered file runs on any runtime.

Each expansion writes the node's own output names, so selections naming them still resolve. Integer
weights (MatMulNBits' packed B, GatherBlockQuantized's data) are unpacked into constants; scales stay
tensors, so their gradients are still exact. Ops without an expansion (the attention family,
RotaryEmbedding, EmbedLayerNormalization, DynamicQuantizeMatMul's straight-through A) stop lowering
with one line naming the node.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto

from ..errors import LoweringError
from ..modelfile.contrib_schema import is_default_domain_contrib
from .context import Ctx, attr
from .rewrite import drop_unused_domains, expand_nodes, opset_of

MS = "com.microsoft"
MIN_OPSET = 13  # ReduceSum's axes input, Split's and Slice's input forms

EXPANSIONS: dict[str, Callable[[Ctx, NodeProto], None]] = {}
# Contrib ops with no expansion -> why (their records say it; lowering stops at them naming the node).
NOT_EXPANDED: dict[str, str] = {}


def expansion(*ops: str):
    def register(fn):
        for op in ops:
            EXPANSIONS[op] = fn
        return fn

    return register


def not_expanded(why: str, *ops: str) -> None:
    for op in ops:
        NOT_EXPANDED[op] = why


def _inputs(node: NodeProto) -> list[str]:
    return list(node.input) + [""] * 10


def _gelu(ctx, x):
    half = ctx.op("Mul", [x, ctx.scalar(0.5, x)])
    erf = ctx.op("Erf", [ctx.op("Div", [x, ctx.scalar(math.sqrt(2.0), x)])])
    return ctx.op("Mul", [half, ctx.op("Add", [erf, ctx.scalar(1.0, x)])])


def _fast_gelu(ctx, x):
    cube = ctx.op("Mul", [x, ctx.op("Mul", [x, x])])
    inner = ctx.op("Add", [x, ctx.op("Mul", [cube, ctx.scalar(0.044715, x)])])
    tanh = ctx.op("Tanh", [ctx.op("Mul", [inner, ctx.scalar(math.sqrt(2.0 / math.pi), x)])])
    return ctx.op("Mul", [ctx.op("Mul", [x, ctx.scalar(0.5, x)]), ctx.op("Add", [tanh, ctx.scalar(1.0, x)])])


def _plus(ctx, x, bias):
    return ctx.op("Add", [x, bias]) if bias else x


def _final(ctx, node, value, k=0):
    ctx.emit("Identity", [value], [node.output[k]])


@expansion("Gelu")
def gelu(ctx, node):
    _final(ctx, node, _gelu(ctx, node.input[0]))


@expansion("BiasGelu")
def bias_gelu(ctx, node):
    _final(ctx, node, _gelu(ctx, ctx.op("Add", list(node.input[:2]))))


@expansion("FastGelu")
def fast_gelu(ctx, node):
    x, bias = _inputs(node)[:2]
    _final(ctx, node, _fast_gelu(ctx, _plus(ctx, x, bias)))


@expansion("QuickGelu")
def quick_gelu(ctx, node):
    x = node.input[0]
    gate = ctx.op("Sigmoid", [ctx.op("Mul", [x, ctx.scalar(attr(node, "alpha", 1.702), x)])])
    _final(ctx, node, ctx.op("Mul", [x, gate]))


@expansion("BiasAdd")
def bias_add(ctx, node):
    x, bias, skip = node.input[:3]
    _final(ctx, node, ctx.op("Add", [ctx.op("Add", [x, bias]), skip]))


@expansion("BiasSplitGelu")
def bias_split_gelu(ctx, node):
    x, bias = node.input[:2]
    width = ctx.need_shape(bias)[0]
    total = ctx.op("Add", [x, bias])
    left = ctx.op("Slice", [total, ctx.ints([0]), ctx.ints([width // 2]), ctx.ints([-1])])
    right = ctx.op("Slice", [total, ctx.ints([width // 2]), ctx.ints([width]), ctx.ints([-1])])
    _final(ctx, node, ctx.op("Mul", [left, _gelu(ctx, right)]))


@expansion("GemmFastGelu")
def gemm_fast_gelu(ctx, node):
    x, w, bias = _inputs(node)[:3]
    _final(ctx, node, _fast_gelu(ctx, _plus(ctx, ctx.op("MatMul", [x, w]), bias)))


def _moved(ctx, t, trans_batch, trans):
    rank = ctx.need_rank(t)
    if rank < 2 or not (trans_batch or trans):
        return t
    perm = list(range(1, rank - 1)) + [0, rank - 1] if trans_batch else list(range(rank))
    if trans:
        perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", [t], perm=perm)


@expansion("FusedMatMul")
def fused_matmul(ctx, node):
    a = _moved(ctx, node.input[0], attr(node, "transBatchA", 0), attr(node, "transA", 0))
    b = _moved(ctx, node.input[1], attr(node, "transBatchB", 0), attr(node, "transB", 0))
    y = ctx.op("MatMul", [a, b])
    alpha = attr(node, "alpha", 1.0)
    _final(ctx, node, y if alpha == 1.0 else ctx.op("Mul", [y, ctx.scalar(alpha, node.input[0])]))


def _activation(ctx, node, y):
    name, params = attr(node, "activation", None), list(attr(node, "activation_params", []) or [])
    if not name:
        return y
    if name in ("Relu", "Tanh", "Sigmoid"):
        return ctx.op(name, [y])
    if name == "LeakyRelu":
        return ctx.op("LeakyRelu", [y], alpha=params[0])
    if name == "Clip":
        return ctx.op("Clip", [y, ctx.scalar(params[0], y), ctx.scalar(params[1], y)])
    if name == "HardSigmoid":
        line = ctx.op("Add", [ctx.op("Mul", [y, ctx.scalar(params[0], y)]), ctx.scalar(params[1], y)])
        return ctx.op("Clip", [line, ctx.scalar(0.0, y), ctx.scalar(1.0, y)])
    raise ctx.error(f"activation {name!r} has no expansion")


@expansion("FusedConv")
def fused_conv(ctx, node):
    x, w, b, z = _inputs(node)[:4]
    conv_attrs = {a: attr(node, a) for a in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
                  if attr(node, a) is not None}
    y = ctx.op("Conv", [x, w] + ([b] if b else []), **conv_attrs)
    _final(ctx, node, _activation(ctx, node, _plus(ctx, y, z)))


def _normalized(ctx, node, s, axes, epsilon, centered):
    """(s − mean) · inv_std (or s · inv_rms), mean and inv_std over `axes`, each keepdims."""
    total = ctx.reduce_sum(s, axes)
    count = ctx.count_ratio(s, total)
    mean = ctx.op("Div", [total, count])
    d = ctx.op("Sub", [s, mean]) if centered else s
    var = ctx.op("Div", [ctx.reduce_sum(ctx.op("Mul", [d, d]), axes), count])
    inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, ctx.scalar(epsilon, s)])])])
    return ctx.op("Mul", [d, inv]), mean, inv


def _norm_outputs(ctx, node, values):
    for k, value in enumerate(values):
        if k < len(node.output) and node.output[k]:
            _final(ctx, node, value, k)


@expansion("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
def skip_layer_norm(ctx, node):
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    names = _inputs(node)
    x, skip, gamma = names[:3]
    beta, bias = (None, names[3]) if simplified else (names[3], names[4])
    s = _plus(ctx, ctx.op("Add", [x, skip]), bias)
    normed, mean, inv = _normalized(ctx, node, s, [-1], attr(node, "epsilon", 1e-12), not simplified)
    y = _plus(ctx, ctx.op("Mul", [normed, gamma]), beta)
    if simplified:
        mean = ctx.fill_like(inv, 0.0)  # the kernel's mean output of an RMS norm
    _norm_outputs(ctx, node, [y, mean, inv, s])


def _axes_from(ctx, x, axis):
    if axis < 0:
        return list(range(axis, 0))
    return list(range(axis, ctx.need_rank(x)))


@expansion("SimplifiedLayerNormalization", "LayerNormalization")
def layer_norm(ctx, node):
    centered = node.op_type == "LayerNormalization"
    names = _inputs(node)
    x, scale, b = names[:3]
    axes = _axes_from(ctx, x, attr(node, "axis", -1))
    normed, mean, inv = _normalized(ctx, node, x, axes, attr(node, "epsilon", 1e-5), centered)
    y = _plus(ctx, ctx.op("Mul", [normed, scale]), b if centered else "")
    _norm_outputs(ctx, node, [y, mean, inv] if centered else [y, inv])


def _unpacked(ctx, t, bits):
    packed = ctx.need_value(t).astype(np.uint8)
    if bits == 8:
        return packed.astype(np.int64)
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    values = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1).astype(np.int64)


def _blockwise(ctx, scales, rows, blocks, block, cols):
    """Per-element scales (rows, cols) from per-block ones, kept a tensor so its gradient stays exact."""
    per_block = ctx.op("Reshape", [scales, ctx.ints([rows, blocks, 1])])
    spread = ctx.op("Expand", [per_block, ctx.ints([rows, blocks, block])])
    flat = ctx.op("Reshape", [spread, ctx.ints([rows, blocks * block])])
    return ctx.op("Slice", [flat, ctx.ints([0]), ctx.ints([cols]), ctx.ints([1])])


@expansion("MatMulNBits")
def matmul_nbits(ctx, node):
    a, b, scales, zero_points, g_idx, bias = _inputs(node)[:6]
    k, n, bits, block = attr(node, "K"), attr(node, "N"), attr(node, "bits", 4), attr(node, "block_size")
    blocks = -(-k // block)
    q = _unpacked(ctx, b, bits).reshape(n, -1)[:, :k]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(ctx.elem(a))
    if g_idx:
        raise ctx.error("g_idx (deprecated) has no expansion")
    if zero_points and ctx.elem(zero_points) != TensorProto.UINT8:
        zero = ctx.op("Reshape", [zero_points, ctx.ints([n, blocks])])
        centered = ctx.op("Sub", [ctx.const(q.astype(dtype)), _blockwise(ctx, zero, n, blocks, block, k)])
    else:
        zp = (_unpacked(ctx, zero_points, bits).reshape(n, -1)[:, :blocks] if zero_points
              else np.full((n, blocks), 1 << (bits - 1)))
        centered = ctx.const((q - np.repeat(zp, block, 1)[:, :k]).astype(dtype))
    weight = ctx.op("Mul", [centered, _blockwise(ctx, scales, n, blocks, block, k)])
    y = ctx.op("MatMul", [a, ctx.op("Transpose", [weight], perm=[1, 0])])
    _final(ctx, node, _plus(ctx, y, bias))


@expansion("GatherBlockQuantized")
def gather_block_quantized(ctx, node):
    data, indices, scales, zero_points = _inputs(node)[:4]
    bits, block = attr(node, "bits", 4), attr(node, "block_size", 128)
    q = _unpacked(ctx, data, bits)
    if q.ndim != 2:
        raise ctx.error("only 2-D tables have an expansion")
    rows, cols = q.shape
    blocks = -(-cols // block)
    zp = _unpacked(ctx, zero_points, bits)[:, :blocks] if zero_points else np.full((rows, blocks), 1 << (bits - 1))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(ctx.elem(scales))
    centered = ctx.const((q - np.repeat(zp, block, 1)[:, :cols]).astype(dtype))
    table = ctx.op("Mul", [centered, _blockwise(ctx, scales, rows, blocks, block, cols)])
    # NOTE: ONNX Gather refuses an index out of range where the kernel gives a zero row.
    _final(ctx, node, ctx.op("Gather", [table, indices], axis=0))


@expansion("MatMulIntegerToFloat")
def matmul_integer_to_float(ctx, node):
    a, b, a_scale, b_scale, a_zero, b_zero, bias = _inputs(node)[:7]
    zeros = [a_zero or "", b_zero] if b_zero else ([a_zero] if a_zero else [])
    acc = ctx.op("MatMulInteger", [a, b] + zeros)
    scale = ctx.op("Mul", [a_scale, b_scale])
    y = ctx.op("Mul", [ctx.op("Cast", [acc], to=ctx.elem(a_scale)), scale])
    _final(ctx, node, _plus(ctx, y, bias))


def _contrib(node: NodeProto, opset: int) -> bool:
    return node.domain == MS or (node.domain in ("", "ai.onnx") and is_default_domain_contrib(node.op_type, opset))


def expand_contrib(proto: ModelProto, weights=None) -> ModelProto:
    """`proto` with every onnxruntime contrib node replaced by its ai.onnx expansion (in place).
    Initializers whose bytes are in `weights` (engine/modelfile/weights.py) are read from there when an
    expansion needs their values."""
    opset = opset_of(proto)
    if not any(_contrib(n, opset) for n in proto.graph.node):
        return proto
    if opset < MIN_OPSET:
        raise LoweringError(f"contrib ops are expanded at opset {MIN_OPSET} or later; the model is opset {opset}")

    def expansion_for(ctx, node):
        if not _contrib(node, opset):
            return None
        fn = EXPANSIONS.get(node.op_type)
        if fn is None:
            raise ctx.error(f"com.microsoft::{node.op_type} has no ai.onnx expansion (those with one: "
                            f"{', '.join(sorted(EXPANSIONS))})")
        return fn

    expand_nodes(proto, weights, expansion_for, "expanded")
    drop_unused_domains(proto, {MS})
    return proto


# The attention family and the other fused contrib ops register their expansions from their own modules.
from . import contrib_attention, contrib_fused  # noqa: E402,F401  (registers)
