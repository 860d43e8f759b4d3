"""onnxruntime's com.microsoft attention family: Attention (packed input projection, BERT/GPT-2),
MultiHeadAttention and RotaryEmbedding; GroupQueryAttention lives in contrib_gqa.py.

Masks are additive, as in the CPU kernels: a masked key gets `mask_filter_value` (-10000 by default)
added to its score, not -inf, so a fully masked row still averages the values instead of giving
zeros. Half inputs are computed in float32 and rounded once, as onnxruntime's CPU provider does
(it runs these kernels in float32 behind inserted casts).
"""
from __future__ import annotations

import math

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register, validates
from .attention import ATTENTION_BACKWARD
from .inputs import bad_attribute

MS = "com.microsoft"


def work_dtype(t, float_dtype=None):
    return float_dtype or torch.promote_types(t.dtype, torch.float32)


def split_heads(t, n_heads):
    """(B, S, N·H) -> (B, N, S, H)."""
    b, s, hidden = t.shape
    if hidden % n_heads:
        raise OnnxGradError(f"hidden size {hidden} is not a multiple of num_heads {n_heads}")
    return t.reshape(b, s, n_heads, hidden // n_heads).transpose(1, 2)


def merge_heads(t):
    """(B, N, S, H) -> (B, S, N·H)."""
    b, n, s, h = t.shape
    return t.transpose(1, 2).reshape(b, s, n * h)


def scores_scale(scale, head_size):
    return 1.0 / math.sqrt(head_size) if not scale else scale


def key_mask(op, mask, batch, q_len, total, past, fill, dtype, device):
    """The additive mask (B, 1, S, T) for onnxruntime's mask_index / key_padding_mask formats:
    (B) valid lengths (right padding), (2B) end then start positions (left padding), (B, T) raw 0/1,
    (B, S, T) raw 0/1 per query; 0 in a raw mask and positions outside [start, end) get `fill`."""
    j = torch.arange(total, device=device)
    if mask.dim() == 1 and mask.shape[0] in (batch, 2 * batch):
        masked = j.reshape(1, -1) >= mask[:batch].reshape(-1, 1)
        if mask.shape[0] == 2 * batch:
            masked = masked | (j.reshape(1, -1) < mask[batch:].reshape(-1, 1))
        masked = masked.reshape(batch, 1, 1, total)
    elif mask.dim() == 1 and mask.shape[0] == 3 * batch + 2:
        raise UnsupportedOpError(f"{op}: the (3·batch + 2) mask_index format (CUDA's packed sequence offsets) "
                                 "is not supported")
    elif mask.dim() == 2 and mask.shape == (batch, total):
        masked = (mask <= 0).reshape(batch, 1, 1, total)
    elif mask.dim() == 3 and mask.shape == (batch, q_len, total):
        masked = (mask <= 0).reshape(batch, 1, q_len, total)
    elif mask.dim() == 4:
        raise UnsupportedOpError(f"{op}: a 4-D (Megatron) mask is not supported (onnxruntime's CPU kernel has none)")
    else:
        raise OnnxGradError(f"{op}: mask of shape {list(mask.shape)} matches none of (B), (2B), (B, {total}), "
                            f"(B, {q_len}, {total}) for B={batch}")
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(masked, torch.full((), fill, dtype=dtype, device=device), zero)


def causal_fill(q_len, total, past, dtype, device):
    """The lowest float where key j lies after query i (j > past + i): the kernel drops those keys outright,
    while masked keys only get mask_filter_value (so a row whose keys are all masked still sees its past)."""
    i = torch.arange(q_len, device=device).reshape(-1, 1)
    j = torch.arange(total, device=device).reshape(1, -1)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(j > past + i, torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device), zero)


def additive_bias(op, mask, unidirectional, attention_bias, batch, q_len, total, past, fill, dtype, device):
    """What the kernels add to the scaled scores: the key mask, the causal fill, the attention bias
    (each where given); None when there is none."""
    add = None if mask is None else key_mask(op, mask, batch, q_len, total, past, fill, dtype, device)
    if unidirectional:
        c = causal_fill(q_len, total, past, dtype, device)
        add = c if add is None else add + c
    if attention_bias is not None:
        add = attention_bias.to(dtype) if add is None else add + attention_bias.to(dtype)
    return add


def attend(q, k, v, scale, bias=None):
    """softmax(scale · q kᵀ + bias) v over (B, N, S, H) tensors; also the logits and probabilities."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    logits = scores if bias is None else scores + bias
    probs = torch.softmax(logits, -1)
    return torch.matmul(probs, v), logits, probs


def _bias_4d(ins, batch, heads, seq, total):
    ins.rank("attention_bias", 4, layout="batch or 1, num_heads or 1, sequence, total length")
    ins.broadcasts("attention_bias", (batch, heads, seq, total), "batch, num_heads, sequence, past + sequence")


@validates("Attention", domain=MS)
def _attention_inputs(ins, *, num_heads, qkv_hidden_sizes=None, **_):
    """onnxruntime's AttentionBase::CheckInputs: weights (D, Q + K + V), bias and past in step with them."""
    batch, seq, width = ins.rank("input", 3, layout="batch, sequence, input hidden")
    ins.rank("weights", 2, layout="input hidden, Q + K + V hidden")
    ins.dim("weights", 0, width, "input's dim 2")
    total_width = ins.shape("weights")[1]
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [total_width // 3] * 3
    if len(sizes) != 3 or sum(sizes) != total_width or sizes[0] != sizes[1]:
        ins.fail("weights", f"dim 1 is {total_width}, expected qkv_hidden_sizes {sizes} summed, Q and K equal")
    for size in sizes:
        if size % num_heads:
            ins.fail("weights", f"holds a hidden size {size} that is not a multiple of num_heads {num_heads}")
    ins.width("bias", total_width, "weights' dim 1")
    past = ins.rank("past", 5, layout="2, batch, num_heads, past length, head size")
    if past is not None:
        head = sizes[0] // num_heads
        for axis, want, why in ((0, 2, "key and value"), (1, batch, "the batch size"), (2, num_heads, "num_heads"),
                                (4, head, f"the head size, {sizes[0]} / num_heads {num_heads}")):
            ins.dim("past", axis, want, why)
        if sizes[0] != sizes[2]:
            ins.fail("past", f"needs Q, K and V hidden sizes equal, qkv_hidden_sizes is {sizes}")
    if ins.given("attention_bias"):
        _bias_4d(ins, batch, num_heads, seq, seq + (past[3] if past else 0))


@describe("Attention", domain=MS, needs="in",
          rule=("dinput = dQKV · weightsᵀ   # dQ = scale · dS · K, dK = scale · dSᵀ · Q, dV = Pᵀ · dO; " + ATTENTION_BACKWARD,
                "dweights = inputᵀ · dQKV",
                "dbias = Σ dQKV over batch and sequence",
                None,
                "dpast = the past positions of [dK, dV] (plus dpresent)",
                "dattention_bias = dS summed to its shape",
                None))
@register("Attention", domain=MS, since=1)
def attention(x, weights, bias=None, mask_index=None, past=None, attention_bias=None, past_sequence_length=None, *,
              num_heads, qkv_hidden_sizes=None, unidirectional=0, scale=None, mask_filter_value=-10000.0,
              do_rotary=0, past_present_share_buffer=0, rotary_embedding_dim=0, n_outputs=1, float_dtype=None):
    op = "Attention"
    if do_rotary:
        raise UnsupportedOpError(f"{op}: do_rotary is not supported (onnxruntime's CPU kernel refuses it too: "
                                 "MultiHeadAttention with RotaryEmbedding is the fused form)")
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [weights.shape[-1] // 3] * 3
    work = work_dtype(x, float_dtype)
    qkv = torch.matmul(x.to(work), weights.to(work))
    if bias is not None:
        qkv = qkv + bias.to(work)
    q, k, v = (split_heads(t, num_heads) for t in qkv.split(sizes, -1))
    batch, q_len = x.shape[0], x.shape[1]
    past_len = 0
    if past is not None:
        if past_present_share_buffer:
            raise UnsupportedOpError(f"{op}: past with past_present_share_buffer=1 is not supported (onnxruntime's "
                                     "CPU kernel rejects it too)")
        past_len = past.shape[3]
        pk, pv = past[0, :, :, :past_len].to(work), past[1, :, :, :past_len].to(work)
        k, v = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
    total = k.shape[2]
    add = additive_bias(op, mask_index, unidirectional, attention_bias, batch, q_len, total, past_len,
                        mask_filter_value, work, x.device)
    out, _, _ = attend(q, k, v, scores_scale(scale, sizes[0] // num_heads), add)
    y = merge_heads(out).to(x.dtype)
    if n_outputs == 1:
        return y
    return y, torch.stack([k, v]).to(x.dtype)


def _mha_key_inputs(ins, batch, hidden, num_heads) -> tuple[int, int]:
    """Key and value in their three forms (B, L, D), packed (B, L, N, 2, H), (B, N, L, H): (L, V's hidden)."""
    head = hidden // num_heads
    key = ins.rank("key", 3, 4, 5, layout="batch, length, hidden; packed KV; or batch, num_heads, length, head")
    ins.dim("key", 0, batch, "the batch size, query's dim 0")
    if len(key) == 5:
        if ins.given("value"):
            ins.fail("value", "must be omitted: key packs the keys and values")
        for axis, want, why in ((2, num_heads, "num_heads"), (3, 2, "key and value"), (4, head, "the head size")):
            ins.dim("key", axis, want, why)
        return key[1], hidden
    if not ins.given("value"):
        ins.fail("value", "is required with an unpacked key")
    ins.rank("value", len(key), layout=f"key's {len(key)} dims")
    ins.dim("value", 0, batch, "the batch size, query's dim 0")
    if len(key) == 4:
        ins.dim("key", 1, num_heads, "num_heads")
        ins.dim("key", 3, head, f"the head size, query's {hidden} / num_heads {num_heads}")
        ins.dim("value", 1, num_heads, "num_heads")
        ins.dim("value", 2, key[2], "the length, key's dim 2")
        return key[2], num_heads * ins.shape("value")[3]
    ins.dim("key", 2, hidden, "query's hidden size, dim 2")
    ins.dim("value", 1, key[1], "the length, key's dim 1")
    v_hidden = ins.shape("value")[2]
    if v_hidden % num_heads:
        ins.fail("value", f"dim 2 is {v_hidden}, expected a multiple of num_heads {num_heads}")
    return key[1], v_hidden


@validates("MultiHeadAttention", domain=MS)
def _mha_inputs_checked(ins, *, num_heads, **_):
    """onnxruntime's multihead_attention_helper::CheckInputs: query, key and value forms, bias, past, bias."""
    query = ins.rank("query", 3, 5, layout="batch, sequence, hidden, or packed batch, sequence, num_heads, 3, head")
    batch, seq = query[:2]
    if len(query) == 5:
        ins.dim("query", 2, num_heads, "num_heads")
        ins.dim("query", 3, 3, "query, key and value")
        for name in ("key", "value", "bias"):
            if ins.given(name):
                ins.fail(name, "must be omitted: query packs the queries, keys and values")
        hidden, length, v_hidden = num_heads * query[4], seq, num_heads * query[4]
    else:
        hidden = query[2]
        if hidden % num_heads:
            ins.fail("query", f"dim 2 is {hidden}, expected a multiple of num_heads {num_heads}")
        if not ins.given("key"):
            ins.fail("key", "is required unless query packs the queries, keys and values")
        length, v_hidden = _mha_key_inputs(ins, batch, hidden, num_heads)
    ins.width("bias", 2 * hidden + v_hidden, "the query, key and value hidden sizes summed")
    _together_past(ins, batch, num_heads, hidden // num_heads, v_hidden // num_heads)
    if ins.given("attention_bias"):
        past = ins.shape("past_key")[2] if ins.given("past_key") else 0
        _bias_4d(ins, batch, num_heads, seq, past + length)


def _together_past(ins, batch, num_heads, head, v_head):
    if ins.given("past_key") != ins.given("past_value"):
        ins.fail("past_value" if ins.given("past_key") else "past_key",
                 "is missing: past_key and past_value are given together or not at all")
    if ins.given("past_key") and len(ins.shape("key") or ()) == 4:
        ins.fail("past_key", "must be omitted: a 4-D key and value are the whole cache")
    for name, width in (("past_key", head), ("past_value", v_head)):
        ins.rank(name, 4, layout="batch, num_heads, past length, head size")
        for axis, want, why in ((0, batch, "the batch size"), (1, num_heads, "num_heads"), (3, width, "the head size")):
            ins.dim(name, axis, want, why)


def _mha_inputs(op, query, key, value, bias, num_heads, work):
    """(q, k, v) as (B, N, S, H) from MultiHeadAttention's input forms, with the projection bias added."""
    if query.dim() == 5:  # packed QKV (B, S, N, 3, H)
        q, k, v = (query[:, :, :, i].to(work).transpose(1, 2) for i in range(3))
        return q, k, v, False
    query = query.to(work)
    hidden = query.shape[-1]
    if bias is not None:
        query = query + bias[:hidden].to(work)
    if key.dim() == 5:  # packed KV (B, L, N, 2, H)
        k, v = key[:, :, :, 0].to(work).transpose(1, 2), key[:, :, :, 1].to(work).transpose(1, 2)
        if bias is not None:
            kb, vb = bias[hidden:2 * hidden].to(work), bias[2 * hidden:].to(work)
            k, v = k + kb.reshape(1, num_heads, 1, -1), v + vb.reshape(1, num_heads, 1, -1)
        return split_heads(query, num_heads), k, v, False
    if key.dim() == 4:  # cross attention with precomputed (B, N, L, H) keys and values: no bias on them
        return split_heads(query, num_heads), key.to(work), value.to(work), True
    key, value = key.to(work), value.to(work)
    if bias is not None:
        key, value = key + bias[hidden:2 * hidden].to(work), value + bias[2 * hidden:].to(work)
    return split_heads(query, num_heads), split_heads(key, num_heads), split_heads(value, num_heads), False


@describe("MultiHeadAttention", domain=MS, needs="in",
          rule=("dquery = scale · dS · K   # " + ATTENTION_BACKWARD,
                "dkey = scale · dSᵀ · Q",
                "dvalue = Pᵀ · dO",
                "dbias = [Σ dquery, Σ dkey, Σ dvalue] over batch and sequence",
                None,
                "dattention_bias = dS summed to its shape",
                "dpast_key = the past positions of dkey",
                "dpast_value = the past positions of dvalue",
                None,
                None))
@register("MultiHeadAttention", domain=MS, since=1)
def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                         past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *,
                         num_heads, scale=None, mask_filter_value=-10000.0, unidirectional=0, n_outputs=1,
                         float_dtype=None):
    op = "MultiHeadAttention"
    if past_sequence_length is not None or cache_indirection is not None:
        raise UnsupportedOpError(f"{op}: past_sequence_length and cache_indirection (shared KV buffers of "
                                 "beam search) are not supported")
    work = work_dtype(query, float_dtype)
    q, k, v, _ = _mha_inputs(op, query, key, value, bias, num_heads, work)
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        k, v = torch.cat([past_key.to(work), k], 2), torch.cat([past_value.to(work), v], 2)
    batch, q_len, total = q.shape[0], q.shape[2], k.shape[2]
    add = additive_bias(op, key_padding_mask, unidirectional, attention_bias, batch, q_len, total, past_len,
                        mask_filter_value, work, q.device)
    out, logits, _ = attend(q, k, v, scores_scale(scale, q.shape[-1]), add)
    dtype = query.dtype
    y = merge_heads(out).to(dtype)
    if n_outputs == 1:
        return y
    return (y, k.to(dtype), v.to(dtype), logits.to(dtype))[:n_outputs]


def rotate(x, cos, sin, interleaved):
    """Rotary embedding of the last axis of x (its rotary part) by angles whose cos/sin are (…, dim/2)."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def rotary_positions(op, position_ids, batch, seq, device):
    """Positions (B or 1, S): a (B, S) tensor as given, or a 1-element start offset (the kernel's (1) form)."""
    if position_ids.numel() == 1 and position_ids.dim() <= 1:
        return (position_ids.reshape(1, 1).long() + torch.arange(seq, device=device).reshape(1, -1))
    if position_ids.shape != (batch, seq):
        raise OnnxGradError(f"{op}: position_ids must be (1) or ({batch}, {seq}), got {list(position_ids.shape)}")
    return position_ids.long()


@validates("RotaryEmbedding", domain=MS)
def _rotary_inputs(ins, *, num_heads=0, rotary_embedding_dim=0, **_):
    """onnxruntime's rotary_embedding_helper::CheckInputs: the caches' width is half the rotary dim."""
    x = ins.rank("input", 3, 4, layout="batch, sequence, hidden or batch, num_heads, sequence, head")
    for name in ("cos_cache", "sin_cache"):
        ins.rank(name, 2, layout="max position, rotary dim / 2")
    half = ins.shape("cos_cache")[1]
    ins.dim("sin_cache", 0, ins.shape("cos_cache")[0], "cos_cache's dim 0")
    ins.dim("sin_cache", 1, half, "cos_cache's dim 1")
    if len(x) == 3 and rotary_embedding_dim and not num_heads:
        bad_attribute("num_heads", num_heads, "set when rotary_embedding_dim is, for a 3-D input")
    head = x[3] if len(x) == 4 else x[2] // num_heads if num_heads else 2 * half
    if len(x) == 3 and (not head or x[2] % head):
        ins.fail("input", f"dim 2 is {x[2]}, expected a multiple of the head size {head}")
    dim = rotary_embedding_dim or head
    if dim > head:
        bad_attribute("rotary_embedding_dim", dim, f"at most the head size {head}")
    whence = f"half rotary_embedding_dim {dim}" if rotary_embedding_dim else \
        f"half the rotary dim {dim}, the head size, rotary_embedding_dim being 0" + (
            f": input's {x[2]} / num_heads {num_heads}" if len(x) == 3 and num_heads else "")
    ins.dim("cos_cache", 1, dim // 2, whence)
    batch, seq = (x[0], x[2]) if len(x) == 4 else x[:2]
    pos = ins["position_ids"]
    if pos.numel() != 1 and ins.shape("position_ids") != (batch, seq):
        ins.fail("position_ids", f"expected [1] or [{batch}, {seq}] (batch, sequence)")


@describe("RotaryEmbedding", domain=MS, needs="in",
          rule=("dinput = dY rotated back by −θ on the rotary dims, dY elsewhere",
                None,
                "dcos_cache = scatter-add at the positions of dY₁ · x₁ + dY₂ · x₂",
                "dsin_cache = scatter-add at the positions of dY₂ · x₁ − dY₁ · x₂"))
@register("RotaryEmbedding", domain=MS, since=1)
def rotary_embedding(x, position_ids, cos_cache, sin_cache, *, interleaved=0, num_heads=0, rotary_embedding_dim=0,
                     scale=1.0, is_packed_batching=0, float_dtype=None):
    op = "RotaryEmbedding"
    if is_packed_batching:
        raise UnsupportedOpError(f"{op}: is_packed_batching (ragged batches) is not supported")
    half = cos_cache.shape[-1]
    if x.dim() == 4:  # (B, N, S, H)
        x4 = x.transpose(1, 2)
    else:
        head = x.shape[-1] // num_heads if num_heads else 2 * half
        x4 = x.reshape(x.shape[0], x.shape[1], -1, head)
    dim = rotary_embedding_dim or x4.shape[-1]
    pos = rotary_positions(op, position_ids, x4.shape[0], x4.shape[1], x.device)
    if int(pos.max()) >= cos_cache.shape[0] or int(pos.min()) < 0:
        raise OnnxGradError(f"{op}: a position is outside the caches' {cos_cache.shape[0]} rows")
    work = work_dtype(x, float_dtype)
    cos, sin = cos_cache[pos].unsqueeze(2).to(work), sin_cache[pos].unsqueeze(2).to(work)  # (B, S, 1, dim/2)
    y = torch.cat([rotate(x4[..., :dim].to(work), cos, sin, interleaved).to(x.dtype), x4[..., dim:]], -1)
    return y.transpose(1, 2) if x.dim() == 4 else y.reshape(x.shape)
