"""GroupQueryAttention and RotaryEmbedding written out as ai.onnx ops (see engine/ops/contrib_gqa.py and
engine/ops/contrib_attention.py for the kernel semantics they follow).

Batch, sequence, past and total lengths stay run-time values (genai models leave them symbolic), so the
cache arithmetic is written with Shape, Range and comparisons: a GatherElements places each batch's
valid past and new keys in the present buffer, and boolean masks say which keys each query sees. Half
inputs are computed in float32 and rounded once at the outputs, as the engine and onnxruntime's CPU
kernels do.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..modelfile.contrib_schema import signature
from .context import attr
from .contrib_table import MS, cast, expansion, final

HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _work(ctx, t) -> int:
    """The element type the kernels compute in: float32 for half inputs, else the input's own."""
    elem = ctx.elem(t)
    return TensorProto.FLOAT if elem in HALF else elem


def _value(ctx, value, elem):
    return ctx.const(np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem)))


def _i64(ctx, value):
    return ctx.const(np.asarray(value, dtype=np.int64))


def _dim(ctx, t, axis):
    """t's dimension `axis` as a 0-d int64 tensor (a constant where shape inference knows it)."""
    shape = ctx.shape(t)
    if shape is not None:
        return _i64(ctx, shape[axis])
    return ctx.op("Gather", [ctx.op("Shape", [t]), _i64(ctx, axis)], axis=0)


def _unsqueeze(ctx, t, axes):
    return ctx.op("Unsqueeze", [t, ctx.ints(axes)])


def _last(ctx, t, start, stop):
    return ctx.op("Slice", [t, ctx.ints([start]), ctx.ints([stop]), ctx.ints([-1])])


def rotate(ctx, x, cos, sin, half, interleaved):
    """The rotary embedding of x's last axis (x of rank 4, 2·half wide) by angles whose cos and sin broadcast
    against (…, half): pairs (x[2i], x[2i+1]) when interleaved, else (x[i], x[i + half])."""
    def turned(x1, x2, c, s):
        return (ctx.op("Sub", [ctx.op("Mul", [x1, c]), ctx.op("Mul", [x2, s])]),
                ctx.op("Add", [ctx.op("Mul", [x1, s]), ctx.op("Mul", [x2, c])]))

    if not interleaved:
        return ctx.op("Concat", list(turned(_last(ctx, x, 0, half), _last(ctx, x, half, 2 * half), cos, sin)), axis=-1)
    pairs = ctx.op("Reshape", [x, ctx.ints([0, 0, 0, half, 2])])
    c, s = _unsqueeze(ctx, cos, [-1]), _unsqueeze(ctx, sin, [-1])
    y = ctx.op("Concat", list(turned(_last(ctx, pairs, 0, 1), _last(ctx, pairs, 1, 2), c, s)), axis=-1)
    return ctx.op("Reshape", [y, ctx.ints([0, 0, 0, 2 * half])])


def _rotary_part(ctx, x, head, cos, sin, half, interleaved, elem=None, work=None):
    """x (…, head), rank 4, with its first 2·half dims rotated and the rest kept; the rotated part is computed
    in `work` and rounded back to `elem` when they differ (RotaryEmbedding on half inputs)."""
    part = x if head == 2 * half else _last(ctx, x, 0, 2 * half)
    if elem != work:
        part = ctx.op("Cast", [part], to=work)
    y = rotate(ctx, part, cos, sin, half, interleaved)
    if elem != work:
        y = ctx.op("Cast", [y], to=elem)
    return y if head == 2 * half else ctx.op("Concat", [y, _last(ctx, x, 2 * half, head)], axis=-1)


def static_last(ctx, t, what):
    """t's last dimension where shape inference knows it."""
    info = ctx.types.get(t)
    if info is None or not info.shape or info.shape[-1] is None:
        raise ctx.error(f"needs the static last dimension of {t!r} ({what}), which shape inference could not find")
    return info.shape[-1]


@expansion("RotaryEmbedding")
def rotary_embedding(ctx, node):
    x, position_ids, cos_cache, sin_cache = node.input[:4]
    if attr(node, "is_packed_batching", 0):
        raise ctx.error("is_packed_batching (ragged batches) has no expansion")
    rank, half = ctx.need_rank(x), static_last(ctx, cos_cache, "the rotary dimension")
    num_heads, dim = attr(node, "num_heads", 0), attr(node, "rotary_embedding_dim", 0)
    if rank == 4:  # (B, N, S, H) -> (B, S, N, H)
        head = static_last(ctx, x, "the head size")
        x4 = ctx.op("Transpose", [x], perm=[0, 2, 1, 3])
    elif rank == 3:
        head = static_last(ctx, x, "the hidden size") // num_heads if num_heads else 2 * half
        x4 = ctx.op("Reshape", [x, ctx.ints([0, 0, -1, head])])
    else:
        raise ctx.error(f"input must be 3-D or 4-D, not rank {rank}")
    if (dim or head) != 2 * half or head < 2 * half:
        raise ctx.error(f"caches of width {half} do not fit a rotary dimension of {dim or head}")
    pos = ctx.op("Cast", [position_ids], to=TensorProto.INT64)
    if ctx.need_rank(position_ids) <= 1:  # a start offset: positions start + 0 … S − 1 for every batch
        steps = ctx.op("Range", [_i64(ctx, 0), _dim(ctx, x, 2 if rank == 4 else 1), _i64(ctx, 1)])
        pos = ctx.op("Add", [ctx.op("Reshape", [pos, ctx.ints([1, 1])]), _unsqueeze(ctx, steps, [0])])
    work = _work(ctx, x)
    cos, sin = (_unsqueeze(ctx, ctx.op("Gather", [cast(ctx, c, work), pos], axis=0), [2])
                for c in (cos_cache, sin_cache))  # (B or 1, S, 1, half)
    y = _rotary_part(ctx, x4, head, cos, sin, half, attr(node, "interleaved", 0), ctx.elem(x), work)
    if rank == 4:
        final(ctx, node, ctx.op("Transpose", [y], perm=[0, 2, 1, 3]), 0)
    else:
        final(ctx, node, ctx.op("Reshape", [y, ctx.op("Shape", [x])]), 0)


GQA_INPUTS = signature(MS, "GroupQueryAttention")[0]


def _named_inputs(node) -> dict:
    return {name: t for name, t in zip(GQA_INPUTS, node.input) if t}


def _refuse_gqa(ctx, node, given) -> None:
    if attr(node, "kv_cache_bit_width", 0) or attr(node, "k_quant_type", "NONE") != "NONE" \
            or attr(node, "v_quant_type", "NONE") != "NONE" or "k_scale" in given or "v_scale" in given:
        raise ctx.error("a quantized KV cache (kv_cache_bit_width, k_quant_type, v_quant_type, k_scale, v_scale) "
                        "has no expansion")
    if attr(node, "sliding_window_cache", 0):
        raise ctx.error("sliding_window_cache=1 (window-sized ring buffers) has no expansion")
    if "query_seqlens" in given:
        raise ctx.error("query_seqlens (right-padded chunked prefill) has no expansion")
    if "seqlens_k" not in given or "total_sequence_length" not in given:
        raise ctx.error("seqlens_k and total_sequence_length are required")
    if ("key" in given) != ("value" in given) or ("past_key" in given) != ("past_value" in given):
        raise ctx.error("key and value (and past_key and past_value) must be given together")
    if attr(node, "do_rotary", 0) and ("cos_cache" not in given or "sin_cache" not in given):
        raise ctx.error("do_rotary needs cos_cache and sin_cache")


def _heads(ctx, t, n, head):
    """(B, S, n·head) -> (B, n, S, head)."""
    return ctx.op("Transpose", [ctx.op("Reshape", [t, ctx.ints([0, 0, n, head])])], perm=[0, 2, 1, 3])


def _qkv(ctx, given, n, nkv, work):
    """q (B, N, S, H) and k, v (B, Nkv, S, H) in the work type, and the head size H."""
    query = given["query"]
    if "key" not in given:  # packed (B, S, (N + 2·Nkv)·H)
        head = static_last(ctx, query, "the packed QKV width") // (n + 2 * nkv)
        packed = cast(ctx, query, work)
        bounds = np.cumsum([0, n * head, nkv * head, nkv * head])
        q, k, v = (_last(ctx, packed, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
    else:
        head = static_last(ctx, query, "the hidden size") // n
        q, k, v = (cast(ctx, given[name], work) for name in ("query", "key", "value"))
    return _heads(ctx, q, n, head), _heads(ctx, k, nkv, head), _heads(ctx, v, nkv, head), head


class _Lengths:
    """The kernel's cache arithmetic as int64 tensors: total (B) valid tokens per batch, past (B) tokens
    before the new ones (0 on the first prompt), buffer P (0-d; None without a past), length L (0-d) of
    the present buffers, steps (S) = 0 … S − 1 and j (L) = 0 … L − 1."""

    def __init__(self, ctx, given):
        query, past_key = given["query"], given.get("past_key")
        self.total = ctx.op("Add", [ctx.op("Cast", [ctx.op("Reshape", [given["seqlens_k"], ctx.ints([-1])])],
                                           to=TensorProto.INT64), _i64(ctx, 1)])
        total_max = ctx.op("Reshape", [ctx.op("Cast", [given["total_sequence_length"]], to=TensorProto.INT64),
                                       ctx.ints([])])
        self.s = _dim(ctx, query, 1)
        self.steps = ctx.op("Range", [_i64(ctx, 0), self.s, _i64(ctx, 1)])
        zeros = ctx.op("Mul", [self.total, _i64(ctx, 0)])
        self.buffer = None if past_key is None else _dim(ctx, past_key, 2)
        self.first = self.buffer is None or ctx.value(self.buffer) == 0  # the first prompt, known statically
        self.later = not self.first and ctx.value(self.buffer) is not None  # a past, known statically
        self.empty = None if self.first or self.later else ctx.op("Equal", [self.buffer, _i64(ctx, 0)])
        if self.first:
            self.past, self.length = zeros, total_max
        else:
            after = ctx.op("Sub", [self.total, self.s])
            self.past = after if self.later else ctx.op("Where", [self.empty, zeros, after])
            self.length = ctx.op("Max", [total_max, self.buffer])
        self.j = ctx.op("Range", [_i64(ctx, 0), self.length, _i64(ctx, 1)])
        self.query_pos = ctx.op("Add", [_unsqueeze(ctx, self.past, [1]), _unsqueeze(ctx, self.steps, [0])])  # (B, S)


def _positions(ctx, given, lengths):
    """The rotary positions (B or 1, S): past + s, or position_ids (only its first element on the first prompt)."""
    ids = given.get("position_ids")
    if ids is None:
        return lengths.query_pos
    ids = ctx.op("Cast", [ids], to=TensorProto.INT64)
    start = _last(ctx, ctx.op("Reshape", [ids, ctx.ints([-1])]), 0, 1)
    first = _unsqueeze(ctx, ctx.op("Add", [start, lengths.steps]), [0])
    if lengths.first:
        return first
    given_ids = ctx.op("Reshape", [ids, ctx.dims(given["query"], 0, 2)])
    return given_ids if lengths.later else ctx.op("Where", [lengths.empty, first, given_ids])


def _present(ctx, past_cache, new, lengths, nkv, head, work):
    """(B, Nkv, L, H): per batch its valid past, the new keys after it, zeros to L."""
    cat = new if past_cache is None else ctx.op("Concat", [cast(ctx, past_cache, work), new], axis=2)
    j, past = _unsqueeze(ctx, lengths.j, [0]), _unsqueeze(ctx, lengths.past, [1])  # (1, L), (B, 1)
    shifted = ctx.op("Sub", [j, past])
    if lengths.buffer is not None:
        shifted = ctx.op("Add", [shifted, lengths.buffer])
    index = ctx.op("Where", [ctx.op("Less", [j, past]), j, shifted])
    valid = ctx.op("Less", [j, ctx.op("Add", [past, lengths.s])])
    index = ctx.op("Where", [valid, index, _i64(ctx, 0)])  # (B, L)
    spread = ctx.op("Expand", [_unsqueeze(ctx, index, [1, 3]), ctx.ints([1, nkv, 1, head])])
    taken = ctx.op("GatherElements", [cat, spread], axis=2)
    return ctx.op("Where", [_unsqueeze(ctx, valid, [1, 3]), taken, _value(ctx, 0.0, work)])


def _visible(ctx, node, lengths):
    """(B, 1, S or 1, L) booleans: the keys each query sees (below the total; causal and windowed when set)."""
    j = lengths.j
    seen = ctx.op("Less", [_unsqueeze(ctx, j, [0, 1]), _unsqueeze(ctx, lengths.total, [1, 2])])  # (B, 1, L)
    if attr(node, "causal", 1):
        query_pos = _unsqueeze(ctx, lengths.query_pos, [2])  # (B, S, 1)
        seen = ctx.op("And", [seen, ctx.op("LessOrEqual", [j, query_pos])])
        window = attr(node, "local_window_size", -1)
        if window > 0:  # the window counts the query's own key
            seen = ctx.op("And", [seen, ctx.op("Greater", [j, ctx.op("Sub", [query_pos, _i64(ctx, window)])])])
    return _unsqueeze(ctx, seen, [1])


def _repeated(ctx, t, group, n, head):
    """(B, Nkv, L, H) -> (B, N, L, H), each kv head serving `group` query heads in a row."""
    if group == 1:
        return t
    spread = ctx.op("Expand", [_unsqueeze(ctx, t, [2]), ctx.ints([1, 1, group, 1, 1])])
    return ctx.op("Reshape", [spread, ctx.ints([0, n, -1, head])])


def _probabilities(ctx, node, given, logits, n, work):
    """softmax over the keys, with the head's sink logit (or smooth_softmax's zero) in each denominator."""
    if "head_sink" in given:
        sink = ctx.op("Reshape", [cast(ctx, given["head_sink"], work), ctx.ints([1, n, 1, 1])])
    elif attr(node, "smooth_softmax", -1) == 1:
        sink = _value(ctx, 0.0, work)
    else:
        return ctx.op("Softmax", [logits], axis=-1)
    column = ctx.op("Concat", [ctx.op("Slice", [ctx.op("Shape", [logits]), ctx.ints([0]), ctx.ints([3])]),
                               ctx.ints([1])], axis=0)
    zeros = ctx.op("ConstantOfShape", [column], value=helper.make_tensor("zero", work, [1], [0.0]))
    probs = ctx.op("Softmax", [ctx.op("Concat", [logits, ctx.op("Add", [zeros, sink])], axis=-1)], axis=-1)
    return ctx.op("Slice", [probs, ctx.ints([0]), ctx.ints([-1]), ctx.ints([-1])])


def _rms_per_head(ctx, t, weight, epsilon, work):
    mean = ctx.reduce("ReduceMean", ctx.op("Mul", [t, t]), [-1])
    inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [mean, _value(ctx, epsilon, work)])])])
    return ctx.op("Mul", [ctx.op("Mul", [t, inv]), cast(ctx, weight, work)])


def _rotary(ctx, node, given, q, k, lengths, head, work):
    half = static_last(ctx, given["cos_cache"], "the rotary dimension")
    if 2 * half > head:
        raise ctx.error(f"caches of width {half} do not fit the head size {head}")
    pos = _positions(ctx, given, lengths)
    cos, sin = (_unsqueeze(ctx, ctx.op("Gather", [cast(ctx, given[c], work), pos], axis=0), [1])
                for c in ("cos_cache", "sin_cache"))  # (B or 1, 1, S, half)
    interleaved = attr(node, "rotary_interleaved", 0)
    return (_rotary_part(ctx, q, head, cos, sin, half, interleaved), _rotary_part(ctx, k, head, cos, sin, half, interleaved))


@expansion("GroupQueryAttention")
def group_query_attention(ctx, node):
    given = _named_inputs(node)
    _refuse_gqa(ctx, node, given)
    n, nkv = attr(node, "num_heads"), attr(node, "kv_num_heads")
    elem = ctx.elem(given["query"])
    work = _work(ctx, given["query"])
    q, k, v, head = _qkv(ctx, given, n, nkv, work)
    lengths = _Lengths(ctx, given)
    if "q_norm_weight" in given:
        epsilon = attr(node, "qk_norm_epsilon", 1e-6)
        q = _rms_per_head(ctx, q, given["q_norm_weight"], attr(node, "q_norm_epsilon", epsilon), work)
        k = _rms_per_head(ctx, k, given["k_norm_weight"], attr(node, "k_norm_epsilon", epsilon), work)
    if attr(node, "do_rotary", 0):
        q, k = _rotary(ctx, node, given, q, k, lengths, head, work)
    present_k = _present(ctx, given.get("past_key"), k, lengths, nkv, head, work)
    present_v = _present(ctx, given.get("past_value"), v, lengths, nkv, head, work)
    keys, values = (_repeated(ctx, t, n // nkv, n, head) for t in (present_k, present_v))
    scores = ctx.op("Mul", [ctx.op("MatMul", [q, ctx.op("Transpose", [keys], perm=[0, 1, 3, 2])]),
                            _value(ctx, attr(node, "scale", 0.0) or head ** -0.5, work)])
    softcap = attr(node, "softcap", 0.0)
    if softcap > 0:
        cap = _value(ctx, softcap, work)
        scores = ctx.op("Mul", [ctx.op("Tanh", [ctx.op("Div", [scores, cap])]), cap])
    if "attention_bias" in given:
        scores = ctx.op("Add", [scores, cast(ctx, given["attention_bias"], work)])
    visible = _visible(ctx, node, lengths)
    probs = _probabilities(ctx, node, given, ctx.op("Where", [visible, scores, _value(ctx, -np.inf, work)]), n, work)
    out = ctx.op("Transpose", [ctx.op("MatMul", [probs, values])], perm=[0, 2, 1, 3])
    outputs = [ctx.op("Reshape", [out, ctx.ints([0, 0, n * head])]), present_k, present_v]
    if len(node.output) > 3 and node.output[3]:
        outputs.append(probs if attr(node, "qk_output", 0) == 2 else
                       ctx.op("Where", [visible, scores, _value(ctx, 0.0, work)]))
    for k_out, value in enumerate(outputs):
        final(ctx, node, value if work == elem else ctx.op("Cast", [value], to=elem), k_out)
