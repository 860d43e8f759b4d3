"""onnxruntime's contrib ops written out as ai.onnx ops before lowering: their definitions, so the
existing backward rules differentiate them and the lowered file runs on any runtime.

Each expansion writes the node's own output names, so selections naming them still resolve. Integer
weights (MatMulNBits' packed B, GatherBlockQuantized's data) are unpacked into constants; scales stay
tensors, so their gradients are still exact. The attention family and the other fused ops expand in
contrib_attention.py and contrib_fused.py. An op without an expansion, or an attribute combination an
expansion cannot write (a quantized KV cache, say), stops lowering with one line naming the node.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto

from ..errors import LoweringError
from ..modelfile.contrib_schema import is_default_domain_contrib
from ..modelfile.index import implicit_inputs
from . import contrib_attention, contrib_fused  # noqa: F401  (importing them registers their expansions)
from .context import attr
from .contrib_table import EXPANSIONS, MS, NOT_EXPANDED, expansion, final, padded_inputs, plus  # noqa: F401  (records)
from .rewrite import drop_unused_domains, expand_nodes, opset_of

MIN_OPSET = 13  # ReduceSum's axes input, Split's and Slice's input forms


def _like(ctx):
    """The expanded node's first input, typed: the tensors an expansion adds have no type until it is inferred."""
    return ctx.node.input[0]


def _gelu(ctx, x):
    half = ctx.op("Mul", [x, ctx.scalar(0.5, _like(ctx))])
    erf = ctx.op("Erf", [ctx.op("Div", [x, ctx.scalar(math.sqrt(2.0), _like(ctx))])])
    return ctx.op("Mul", [half, ctx.op("Add", [erf, ctx.scalar(1.0, _like(ctx))])])


def _fast_gelu(ctx, x):
    like = _like(ctx)
    cube = ctx.op("Mul", [x, ctx.op("Mul", [x, x])])
    inner = ctx.op("Add", [x, ctx.op("Mul", [cube, ctx.scalar(0.044715, like)])])
    tanh = ctx.op("Tanh", [ctx.op("Mul", [inner, ctx.scalar(math.sqrt(2.0 / math.pi), like)])])
    return ctx.op("Mul", [ctx.op("Mul", [x, ctx.scalar(0.5, like)]), ctx.op("Add", [tanh, ctx.scalar(1.0, like)])])


@expansion("Gelu")
def gelu(ctx, node):
    final(ctx, node, _gelu(ctx, node.input[0]))


@expansion("BiasGelu")
def bias_gelu(ctx, node):
    final(ctx, node, _gelu(ctx, ctx.op("Add", list(node.input[:2]))))


@expansion("FastGelu")
def fast_gelu(ctx, node):
    x, bias = padded_inputs(node)[:2]
    final(ctx, node, _fast_gelu(ctx, plus(ctx, x, bias)))


@expansion("QuickGelu")
def quick_gelu(ctx, node):
    x = node.input[0]
    gate = ctx.op("Sigmoid", [ctx.op("Mul", [x, ctx.scalar(attr(node, "alpha", 1.702), x)])])
    final(ctx, node, ctx.op("Mul", [x, gate]))


@expansion("BiasAdd")
def bias_add(ctx, node):
    x, bias, skip = node.input[:3]
    final(ctx, node, ctx.op("Add", [ctx.op("Add", [x, bias]), skip]))


@expansion("BiasSplitGelu")
def bias_split_gelu(ctx, node):
    x, bias = node.input[:2]
    width = ctx.need_shape(bias)[0]
    total = ctx.op("Add", [x, bias])
    left = ctx.op("Slice", [total, ctx.ints([0]), ctx.ints([width // 2]), ctx.ints([-1])])
    right = ctx.op("Slice", [total, ctx.ints([width // 2]), ctx.ints([width]), ctx.ints([-1])])
    final(ctx, node, ctx.op("Mul", [left, _gelu(ctx, right)]))


@expansion("GemmFastGelu")
def gemm_fast_gelu(ctx, node):
    x, w, bias = padded_inputs(node)[:3]
    final(ctx, node, _fast_gelu(ctx, plus(ctx, ctx.op("MatMul", [x, w]), bias)))


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
    final(ctx, node, y if alpha == 1.0 else ctx.op("Mul", [y, ctx.scalar(alpha, node.input[0])]))


def _activation(ctx, node, y):
    name, params = attr(node, "activation", None), list(attr(node, "activation_params", []) or [])
    if not name:
        return y
    if name in ("Relu", "Tanh", "Sigmoid"):
        return ctx.op(name, [y])
    if name == "LeakyRelu":
        return ctx.op("LeakyRelu", [y], alpha=params[0])
    like = _like(ctx)
    if name == "Clip":
        return ctx.op("Clip", [y, ctx.scalar(params[0], like), ctx.scalar(params[1], like)])
    if name == "HardSigmoid":
        line = ctx.op("Add", [ctx.op("Mul", [y, ctx.scalar(params[0], like)]), ctx.scalar(params[1], like)])
        return ctx.op("Clip", [line, ctx.scalar(0.0, like), ctx.scalar(1.0, like)])
    raise ctx.error(f"activation {name!r} has no expansion")


@expansion("FusedConv")
def fused_conv(ctx, node):
    x, w, b, z = padded_inputs(node)[:4]
    conv_attrs = {a: attr(node, a) for a in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
                  if attr(node, a) is not None}
    y = ctx.op("Conv", [x, w] + ([b] if b else []), **conv_attrs)
    final(ctx, node, _activation(ctx, node, plus(ctx, y, z)))


def _stats_type(ctx, x, stash_type=1):
    """The kernels' statistics type: float32 for half inputs (stash_type 1), else the input's own."""
    elem = ctx.elem(x)
    return TensorProto.FLOAT if stash_type == 1 and elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16) else elem


def _as(ctx, t, elem, now):
    """t (of type `now`) as `elem`."""
    return t if elem == now else ctx.op("Cast", [t], to=elem)


def _normalized(ctx, s, axes, epsilon, centered, work):
    """(s − mean) · inv_std (or s · inv_rms), mean (None for an RMS norm) and inv_std over `axes`, each
    keepdims; s and the statistics in `work`."""
    mean = ctx.reduce("ReduceMean", s, axes) if centered else None
    d = ctx.op("Sub", [s, mean]) if centered else s
    var = ctx.reduce("ReduceMean", ctx.op("Mul", [d, d]), axes)
    epsilon = ctx.const(np.asarray(epsilon, onnx.helper.tensor_dtype_to_np_dtype(work)))
    inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, epsilon])])])
    return ctx.op("Mul", [d, inv]), mean, inv


def _norm_outputs(ctx, node, values):
    for k, value in enumerate(values):
        final(ctx, node, value, k)


@expansion("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
def skip_layer_norm(ctx, node):
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    names = padded_inputs(node)
    x, skip, gamma = names[:3]
    beta, bias = (None, names[3]) if simplified else (names[3], names[4])
    s = plus(ctx, ctx.op("Add", [x, skip]), bias)
    elem, work = ctx.elem(x), _stats_type(ctx, x)
    normed, mean, inv = _normalized(ctx, _as(ctx, s, work, elem), [-1], attr(node, "epsilon", 1e-12), not simplified,
                                    work)
    y = ctx.op("Mul", [normed, _as(ctx, gamma, work, ctx.elem(gamma))])
    if beta:
        y = ctx.op("Add", [y, _as(ctx, beta, work, ctx.elem(beta))])
    y = _as(ctx, y, elem, work)
    if simplified:  # the kernel's mean output of an RMS norm
        mean = ctx.op("ConstantOfShape", [ctx.op("Shape", [inv])], value=onnx.helper.make_tensor("zero", work, [1], [0]))
    _norm_outputs(ctx, node, [y, mean, inv, s])


def _axes_from(ctx, x, axis):
    if axis < 0:
        return list(range(axis, 0))
    return list(range(axis, ctx.need_rank(x)))


@expansion("SimplifiedLayerNormalization", "LayerNormalization")
def layer_norm(ctx, node):
    centered = node.op_type == "LayerNormalization"
    names = padded_inputs(node)
    x, scale, b = names[:3]
    axes = _axes_from(ctx, x, attr(node, "axis", -1))
    elem, work = ctx.elem(x), _stats_type(ctx, x, attr(node, "stash_type", 1))
    normed, mean, inv = _normalized(ctx, _as(ctx, x, work, elem), axes, attr(node, "epsilon", 1e-5), centered, work)
    y = plus(ctx, ctx.op("Mul", [_as(ctx, normed, elem, work), scale]), b if centered else "")
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


def _per_feature(ctx, table, n, blocks, group, work):
    """(n, K) from a per-block (n, blocks) tensor: each input feature's block (`group`), kept a tensor so
    its gradient stays exact."""
    rows = ctx.op("Reshape", [_as(ctx, table, work, ctx.elem(table)), ctx.ints([n, blocks])])
    return ctx.op("Gather", [rows, ctx.ints(group)], axis=1)


@expansion("MatMulNBits")
def matmul_nbits(ctx, node):
    a, b, scales, zero_points, g_idx, bias = padded_inputs(node)[:6]
    k, n, bits, block = attr(node, "K"), attr(node, "N"), attr(node, "bits", 4), attr(node, "block_size")
    blocks = -(-k // block)
    elem, work = ctx.elem(a), _stats_type(ctx, a)  # half inputs are computed in float32, as the kernel does
    dtype = onnx.helper.tensor_dtype_to_np_dtype(work)
    q = _unpacked(ctx, b, bits).reshape(n, -1)[:, :k]
    if g_idx and bits != 4:
        raise ctx.error(f"g_idx with {bits}-bit weights has no expansion (onnxruntime's CPU kernel takes 4 bits)")
    # NOTE: g_idx (deprecated, act-order) says which block each input feature's scale and zero point come from.
    group = ctx.need_value(g_idx).astype(np.int64).reshape(-1) if g_idx else np.arange(k) // block
    if zero_points and ctx.elem(zero_points) != TensorProto.UINT8:
        centered = ctx.op("Sub", [ctx.const(q.astype(dtype)), _per_feature(ctx, zero_points, n, blocks, group, work)])
    else:
        # NOTE: onnxruntime's CPU kernel ignores uint8 zero points when g_idx is given (as the engine does).
        zp = (_unpacked(ctx, zero_points, bits).reshape(n, -1)[:, :blocks] if zero_points and not g_idx
              else np.full((n, blocks), 1 << (bits - 1)))
        centered = ctx.const((q - zp[:, group]).astype(dtype))
    weight = ctx.op("Mul", [centered, _per_feature(ctx, scales, n, blocks, group, work)])
    y = ctx.op("MatMul", [_as(ctx, a, work, elem), ctx.op("Transpose", [weight], perm=[1, 0])])
    if bias:
        y = ctx.op("Add", [y, _as(ctx, bias, work, ctx.elem(bias))])
    final(ctx, node, _as(ctx, y, elem, work))


@expansion("GatherBlockQuantized")
def gather_block_quantized(ctx, node):
    data, indices, scales, zero_points = padded_inputs(node)[:4]
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
    # NOTE: an index outside [-rows, rows) gives a row of zeros (the kernel's rule), where ONNX Gather refuses it.
    none, count = ctx.const(np.asarray(0, np.int64)), ctx.const(np.asarray(rows, np.int64))  # 0-d: so is a scalar index
    index = ctx.op("Cast", [indices], to=TensorProto.INT64)
    index = ctx.op("Where", [ctx.op("Less", [index, none]), ctx.op("Add", [index, count]), index])
    inside = ctx.op("And", [ctx.op("Not", [ctx.op("Less", [index, none])]), ctx.op("Less", [index, count])])
    picked = ctx.op("Gather", [table, ctx.op("Where", [inside, index, none])], axis=0)
    zero = ctx.const(np.zeros((), dtype))
    final(ctx, node, ctx.op("Where", [ctx.op("Unsqueeze", [inside, ctx.ints([-1])]), picked, zero]))


@expansion("MatMulIntegerToFloat")
def matmul_integer_to_float(ctx, node):
    a, b, a_scale, b_scale, a_zero, b_zero, bias = padded_inputs(node)[:7]
    zeros = [a_zero or "", b_zero] if b_zero else ([a_zero] if a_zero else [])
    acc = ctx.op("MatMulInteger", [a, b] + zeros)
    scale = ctx.op("Mul", [a_scale, b_scale])
    y = ctx.op("Mul", [ctx.op("Cast", [acc], to=ctx.elem(a_scale)), scale])
    final(ctx, node, plus(ctx, y, bias))


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

    packed = {t for n in proto.graph.node if _contrib(n, opset) for t in n.input}
    expand_nodes(proto, weights, expansion_for, "expanded")
    drop_unused_domains(proto, {MS})
    _drop_unread(proto.graph, packed)
    return proto


def _drop_unread(graph, candidates) -> None:
    """In place: the initializers among `candidates` nothing reads any more (MatMulNBits' packed weights,
    unpacked into constants): onnxruntime warns about each, and they would double the file's size."""
    read = {t for n in graph.node for t in list(n.input) + list(implicit_inputs(n))} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read or t.name not in candidates]
    if len(kept) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
