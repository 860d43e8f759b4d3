"""Attention, MultiHeadAttention, EmbedLayerNormalization and DynamicQuantizeMatMul written out as ai.onnx
ops (see engine/ops/contrib_attention.py, contrib_norm.py and contrib_quant.py for the kernel semantics they
follow).

As in the engine, half inputs are computed in float32 (double stays double) and the outputs rounded once.
Only a tensor the node reads may be asked for its type or shape here: the nodes an expansion adds are typed
after it returns.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .context import attr
from .contrib_table import cast, expansion, final, padded_inputs, plus


def _work(ctx, t) -> int:
    return TensorProto.DOUBLE if ctx.elem(t) == TensorProto.DOUBLE else TensorProto.FLOAT


def _number(value, elem) -> np.ndarray:
    return np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem))


def _output(ctx, node, k, value, work, elem):
    """Output k of the node (when it is wanted), rounded from the work type to `elem` once."""
    if k < len(node.output) and node.output[k]:
        if work == elem:
            final(ctx, node, value, k)
        else:
            ctx.emit("Cast", [value], [node.output[k]], to=elem)


def _length(ctx, t, axis):
    """t's dimension `axis` as an int64 scalar, read at run time (t may be a tensor built here)."""
    dim = ctx.op("Slice", [ctx.op("Shape", [t]), ctx.ints([axis]), ctx.ints([axis + 1])])
    return ctx.op("Squeeze", [dim, ctx.ints([0])])


def _arange(ctx, n):
    return ctx.op("Range", [ctx.const(np.asarray(0, np.int64)), n, ctx.const(np.asarray(1, np.int64))])


def _heads(ctx, t, n_heads):
    """(B, S, N·H) -> (B, N, S, H)."""
    return ctx.op("Transpose", [ctx.op("Reshape", [t, ctx.ints([0, 0, n_heads, -1])])], perm=[0, 2, 1, 3])


def _merged(ctx, t):
    """(B, N, S, H) -> (B, S, N·H)."""
    return ctx.op("Reshape", [ctx.op("Transpose", [t], perm=[0, 2, 1, 3]), ctx.ints([0, 0, -1])])


def _key_masked(ctx, mask, query, total):
    """Where the kernels' mask_index / key_padding_mask masks a key, as a bool broadcastable to
    (B, N, S, T): (B) valid lengths, (2B) ends then starts, (B, T) or (B, S, T) raw 0/1 (0 masks).
    `query`: the node's input whose dimension 0 is the batch."""
    rank = ctx.need_rank(mask)
    if rank == 1:
        length, batch = _dim(ctx, mask, 0), _dim(ctx, query, 0)
        if length is not None and batch is not None and length not in (batch, 2 * batch):
            form = "the (3·batch + 2) format" if length == 3 * batch + 2 else "neither (B) nor (2B)"
            raise ctx.error(f"mask {mask!r} of length {length} for batch {batch} is {form}: no expansion (the engine "
                            "refuses it)")
        j = _arange(ctx, total)
        bounds = ctx.op("Cast", [mask], to=TensorProto.INT64)
        b = ctx.op("Slice", [ctx.op("Shape", [query]), ctx.ints([0]), ctx.ints([1])])
        ends = ctx.op("Slice", [bounds, ctx.ints([0]), b])
        masked = ctx.op("Not", [ctx.op("Less", [j, ctx.op("Unsqueeze", [ends, ctx.ints([1])])])])
        if length is None or batch is None or length == 2 * batch:
            # (B) or (2B) known only at run time: zeros after the mask make the starts of a (B) mask 0
            zeros = ctx.op("ConstantOfShape", [b], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
            padded = ctx.op("Concat", [bounds, zeros], axis=0)
            starts = ctx.op("Slice", [padded, b, ctx.op("Add", [b, b])])
            masked = ctx.op("Or", [masked, ctx.op("Less", [j, ctx.op("Unsqueeze", [starts, ctx.ints([1])])])])
        return ctx.op("Unsqueeze", [masked, ctx.ints([1, 2])])
    if rank not in (2, 3):
        raise ctx.error(f"a {rank}-D mask {mask!r} has no expansion (the engine refuses it)")
    masked = ctx.op("Not", [ctx.op("Greater", [mask, ctx.const(_number(0, ctx.elem(mask)))])])
    return ctx.op("Unsqueeze", [masked, ctx.ints([1, 2] if rank == 2 else [1])])


def _additive(ctx, node, mask, attention_bias, query, q_len, total, past_len, work):
    """What the kernels add to the scaled scores (as the engine's additive_bias): the key mask's
    mask_filter_value, the lowest float on keys after the query (unidirectional), the attention bias."""
    zero = ctx.const(_number(0, work)) if mask or attr(node, "unidirectional", 0) else None
    terms = []
    if mask:
        fill = ctx.const(_number(attr(node, "mask_filter_value", -10000.0), work))
        terms.append(ctx.op("Where", [_key_masked(ctx, mask, query, total), fill, zero]))
    if attr(node, "unidirectional", 0):
        i = ctx.op("Unsqueeze", [_arange(ctx, q_len), ctx.ints([1])])
        after = ctx.op("Greater", [ctx.op("Sub", [_arange(ctx, total), i]), past_len or ctx.const(np.asarray(0, np.int64))])
        lowest = ctx.const(_number(np.finfo(helper.tensor_dtype_to_np_dtype(work)).min, work))
        terms.append(ctx.op("Where", [after, lowest, zero]))
    if attention_bias:
        terms.append(cast(ctx, attention_bias, work))
    add = terms[0] if terms else None
    for term in terms[1:]:
        add = ctx.op("Add", [add, term])
    return add


def _attend(ctx, q, k, v, scale, add, work):
    """softmax(scale · q kᵀ + add) v over (B, N, S, H) tensors; also the logits."""
    scores = ctx.op("Mul", [ctx.op("MatMul", [q, ctx.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                            ctx.const(_number(scale, work))])
    logits = scores if add is None else ctx.op("Add", [scores, add])
    return ctx.op("MatMul", [ctx.op("Softmax", [logits], axis=-1), v]), logits


def _scale(node, head_size):
    return attr(node, "scale", 0.0) or 1.0 / float(np.sqrt(head_size))


def _dim(ctx, t, axis):
    """t's static dimension `axis`, None where unknown."""
    shape = ctx.types[t].shape if t in ctx.types else None
    return shape[axis] if shape else None


def _need_dim(ctx, t, axis):
    dim = _dim(ctx, t, axis)
    if dim is None:
        raise ctx.error(f"needs the static dimension {axis} of {t!r}, which shape inference could not find")
    return dim


@expansion("Attention")
def attention(ctx, node):
    x, weights, bias, mask, past, attention_bias = padded_inputs(node)[:6]
    heads = attr(node, "num_heads")
    if attr(node, "do_rotary", 0):
        raise ctx.error("do_rotary has no expansion (the engine and onnxruntime's CPU kernel refuse it)")
    if past and attr(node, "past_present_share_buffer", 0):
        raise ctx.error("past with past_present_share_buffer=1 has no expansion (the engine refuses it)")
    width = _need_dim(ctx, weights, -1)
    sizes = list(attr(node, "qkv_hidden_sizes", None) or [width // 3] * 3)
    work, elem = _work(ctx, x), ctx.elem(x)
    qkv = plus(ctx, ctx.op("MatMul", [cast(ctx, x, work), cast(ctx, weights, work)]), cast(ctx, bias, work))
    q, k, v = (_heads(ctx, t, heads) for t in ctx.op("Split", [qkv, ctx.ints(sizes)], n=3, axis=-1))
    past_len = None
    if past:
        past_w = cast(ctx, past, work)
        pk, pv = (ctx.op("Gather", [past_w, ctx.const(np.asarray(i, np.int64))], axis=0) for i in (0, 1))
        k, v = ctx.op("Concat", [pk, k], axis=2), ctx.op("Concat", [pv, v], axis=2)
        past_len = _length(ctx, past, 3)
    add = _additive(ctx, node, mask, attention_bias, x, _length(ctx, x, 1), _length(ctx, k, 2),
                    past_len, work)
    out, _ = _attend(ctx, q, k, v, _scale(node, sizes[0] // heads), add, work)
    _output(ctx, node, 0, _merged(ctx, out), work, elem)
    if len(node.output) > 1 and node.output[1]:
        present = ctx.op("Concat", [ctx.op("Unsqueeze", [t, ctx.ints([0])]) for t in (k, v)], axis=0)
        _output(ctx, node, 1, present, work, elem)


def _part(ctx, bias, k, hidden):
    """The query's, key's or value's part of the packed projection bias (the value's may be wider)."""
    end = (k + 1) * hidden if k < 2 else 2**62
    return ctx.op("Slice", [bias, ctx.ints([k * hidden]), ctx.ints([end])])


def _unpacked(ctx, packed, count):
    """(B, S, N, count, H) -> count tensors (B, N, S, H)."""
    parts = ctx.op("Split", [packed, ctx.ints([1] * count)], n=count, axis=3)
    return [ctx.op("Transpose", [ctx.op("Squeeze", [p, ctx.ints([3])])], perm=[0, 2, 1, 3]) for p in parts]


def _mha_inputs(ctx, node, heads, work):
    """(q, k, v) as (B, N, S, H) from MultiHeadAttention's input forms, the projection bias added; the
    head size; whether key and value are precomputed (B, N, L, H) ones (as the engine's _mha_inputs)."""
    query, key, value, bias = (cast(ctx, t, work) for t in padded_inputs(node)[:4])
    rank = ctx.need_rank(node.input[0])
    if rank == 5:
        q, k, v = _unpacked(ctx, query, 3)
        return q, k, v, _need_dim(ctx, node.input[0], -1), False
    hidden = _need_dim(ctx, node.input[0], -1)
    q = _heads(ctx, plus(ctx, query, bias and _part(ctx, bias, 0, hidden)), heads)
    key_rank = ctx.need_rank(node.input[1])
    if key_rank == 5:
        k, v = _unpacked(ctx, key, 2)
        if bias:
            k, v = (ctx.op("Add", [t, ctx.op("Reshape", [_part(ctx, bias, i, hidden), ctx.ints([1, heads, 1, -1])])])
                    for i, t in ((1, k), (2, v)))
        return q, k, v, hidden // heads, False
    if key_rank == 4:
        return q, key, value, hidden // heads, True
    k = _heads(ctx, plus(ctx, key, bias and _part(ctx, bias, 1, hidden)), heads)
    v = _heads(ctx, plus(ctx, value, bias and _part(ctx, bias, 2, hidden)), heads)
    return q, k, v, hidden // heads, False


@expansion("MultiHeadAttention")
def multi_head_attention(ctx, node):
    names = padded_inputs(node)
    mask, attention_bias, past_key, past_value = names[4:8]
    if names[8] or names[9]:
        raise ctx.error("past_sequence_length and cache_indirection (beam search's shared buffers) have no "
                        "expansion (the engine refuses them)")
    heads, query = attr(node, "num_heads"), node.input[0]
    work, elem = _work(ctx, query), ctx.elem(query)
    q, k, v, head_size, precomputed = _mha_inputs(ctx, node, heads, work)
    past_len = None
    if past_key:
        if precomputed:
            raise ctx.error("past_key/past_value cannot extend 4-D (precomputed) key and value")
        k = ctx.op("Concat", [cast(ctx, past_key, work), k], axis=2)
        v = ctx.op("Concat", [cast(ctx, past_value, work), v], axis=2)
        past_len = _length(ctx, past_key, 2)
    add = _additive(ctx, node, mask, attention_bias, query, _length(ctx, q, 2), _length(ctx, k, 2),
                    past_len, work)
    out, logits = _attend(ctx, q, k, v, _scale(node, head_size), add, work)
    for i, value in enumerate((_merged(ctx, out), k, v, logits)):
        _output(ctx, node, i, value, work, elem)


@expansion("EmbedLayerNormalization")
def embed_layer_norm(ctx, node):
    ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids = padded_inputs(node)[:9]
    if not (gamma and beta):
        raise ctx.error("gamma and beta are required")
    if not position_ids:
        position_ids = ctx.op("Unsqueeze", [_arange(ctx, _length(ctx, ids, 1)), ctx.ints([0])])
    total = ctx.op("Add", [ctx.op("Gather", [word, ids], axis=0), ctx.op("Gather", [position, position_ids], axis=0)])
    if segment_ids:
        total = ctx.op("Add", [total, ctx.op("Gather", [segment, segment_ids], axis=0)])
    elem, work = ctx.elem(word), _work(ctx, word)
    s = cast(ctx, total, work, elem)
    d = ctx.op("Sub", [s, ctx.reduce("ReduceMean", s, [-1])])
    var = ctx.op("Add", [ctx.reduce("ReduceMean", ctx.op("Mul", [d, d]), [-1]),
                         ctx.const(_number(attr(node, "epsilon", 1e-12), work))])
    normed = ctx.op("Mul", [d, ctx.op("Reciprocal", [ctx.op("Sqrt", [var])])])
    y = ctx.op("Add", [ctx.op("Mul", [normed, cast(ctx, gamma, work)]), cast(ctx, beta, work)])
    _output(ctx, node, 0, y, work, elem)
    if len(node.output) > 1 and node.output[1]:
        if mask:  # the kernel counts the entries equal to 1, not the nonzero ones
            ones = ctx.op("Cast", [ctx.op("Equal", [mask, ctx.const(_number(1, ctx.elem(mask)))])], to=TensorProto.INT32)
            count = ctx.op("ReduceSum", [ones, ctx.ints([-1])], keepdims=0)
        else:
            count = ctx.op("ConstantOfShape", [ctx.op("Slice", [ctx.op("Shape", [ids]), ctx.ints([0]), ctx.ints([1])])],
                           value=helper.make_tensor("zero", TensorProto.INT32, [1], [0]))
        final(ctx, node, count, 1)
    _output(ctx, node, 2, total, elem, elem)


def _per_column(ctx, t, work):
    """A scalar or per-column (N) scale / zero point in the work type, broadcastable over B's columns."""
    single = int(np.prod(ctx.need_shape(t))) == 1
    t = cast(ctx, t, work)
    return ctx.op("Reshape", [t, ctx.ints([])]) if single else t


@expansion("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(ctx, node):
    a, b, b_scale, b_zero, bias = padded_inputs(node)[:5]
    if ctx.elem(b) not in (TensorProto.INT8, TensorProto.UINT8):
        raise ctx.error(f"B {b!r} must be int8 or uint8")
    work, elem = _work(ctx, a), ctx.elem(a)
    centered = ctx.op("Cast", [b], to=work)
    if b_zero:
        centered = ctx.op("Sub", [centered, _per_column(ctx, b_zero, work)])
    weight = ctx.op("Mul", [centered, _per_column(ctx, b_scale, work)])
    # The kernel multiplies A after a uint8 round trip (DynamicQuantizeLinear, in float32 whatever A's type):
    # A_q. The integer q carries no gradient and the lowering's DynamicQuantizeLinear rule gives its scale
    # none (the engine detaches the whole round trip), so A_q reaches A with gradient 0. The engine's
    # backward is straight-through, A + stop(A_q - A): A's own gradient enters through fmod(A, tiny), the
    # remainder of A below the smallest normal float. It is 0 wherever |A| ≥ 2^-103 in float32 (2^-970 in
    # double: A is then a multiple of tiny, and fmod is exact) and under tiny (1e-38) elsewhere, while its
    # derivative is 1 (Mod's rule: dA = g), so A_used is A_q in value and A in gradient: dA = dY · weightᵀ,
    # the engine's straight-through VJP.
    a_work = cast(ctx, a, work)
    a_q = ctx.op("DequantizeLinear", ctx.op("DynamicQuantizeLinear", [cast(ctx, a, TensorProto.FLOAT)], n=3))
    a_q = cast(ctx, a_q, work, TensorProto.FLOAT)
    tiny = ctx.const(_number(np.finfo(helper.tensor_dtype_to_np_dtype(work)).tiny, work))
    a_used = ctx.op("Add", [a_q, ctx.op("Mod", [a_work, tiny], fmod=1)])
    y = plus(ctx, ctx.op("MatMul", [a_used, weight]), cast(ctx, bias, work))
    _output(ctx, node, 0, y, work, elem)
