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
from ..registry import describe, register
from .attention import ATTENTION_BACKWARD

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
    if x.dim() != 3:
        raise OnnxGradError(f"{op}: input must be (batch, sequence, hidden), got {list(x.shape)}")
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [weights.shape[-1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != weights.shape[-1] or sizes[0] != sizes[1]:
        raise OnnxGradError(f"{op}: qkv_hidden_sizes {sizes} do not split weights of width {weights.shape[-1]} "
                            "(Q and K sizes must be equal)")
    work = work_dtype(x, float_dtype)
    qkv = torch.matmul(x.to(work), weights.to(work))
    if bias is not None:
        qkv = qkv + bias.to(work)
    q, k, v = (split_heads(t, num_heads) for t in qkv.split(sizes, -1))
    batch, q_len = x.shape[0], x.shape[1]
    past_len = 0
    if past is not None:
        if past.dim() != 5 or past.shape[0] != 2:
            raise OnnxGradError(f"{op}: past must be (2, batch, num_heads, past_length, head_size), got {list(past.shape)}")
        if sizes[0] != sizes[2]:
            raise OnnxGradError(f"{op}: with past, Q, K and V hidden sizes must be equal, got {sizes}")
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


def _mha_inputs(op, query, key, value, bias, num_heads, work):
    """(q, k, v) as (B, N, S, H) from MultiHeadAttention's input forms, with the projection bias added."""
    if query.dim() == 5:  # packed QKV (B, S, N, 3, H)
        if key is not None or value is not None or bias is not None:
            raise OnnxGradError(f"{op}: packed QKV takes no key, value or bias")
        q, k, v = (query[:, :, :, i].to(work).transpose(1, 2) for i in range(3))
        return q, k, v, False
    if query.dim() != 3:
        raise OnnxGradError(f"{op}: query must be (B, S, D) or packed (B, S, N, 3, H), got {list(query.shape)}")
    query = query.to(work)
    if key is None:
        raise OnnxGradError(f"{op}: key is required unless query packs Q, K and V")
    hidden = query.shape[-1]
    if bias is not None:
        query = query + bias[:hidden].to(work)
    if key.dim() == 5:  # packed KV (B, L, N, 2, H)
        if value is not None:
            raise OnnxGradError(f"{op}: packed KV takes no value")
        k, v = key[:, :, :, 0].to(work).transpose(1, 2), key[:, :, :, 1].to(work).transpose(1, 2)
        if bias is not None:
            kb, vb = bias[hidden:2 * hidden].to(work), bias[2 * hidden:].to(work)
            k, v = k + kb.reshape(1, num_heads, 1, -1), v + vb.reshape(1, num_heads, 1, -1)
        return split_heads(query, num_heads), k, v, False
    if value is None:
        raise OnnxGradError(f"{op}: value is required with an unpacked key")
    if key.dim() == 4:  # cross attention with precomputed (B, N, L, H) keys and values: no bias on them
        if value.dim() != 4:
            raise OnnxGradError(f"{op}: a 4-D key needs a 4-D value")
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
    if (past_key is None) != (past_value is None):
        raise OnnxGradError(f"{op}: past_key and past_value must be given together")
    work = work_dtype(query, float_dtype)
    q, k, v, cross = _mha_inputs(op, query, key, value, bias, num_heads, work)
    past_len = 0
    if past_key is not None:
        if cross:
            raise OnnxGradError(f"{op}: past_key/past_value cannot extend 4-D (precomputed) key and value")
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
    elif x.dim() == 3:
        if rotary_embedding_dim and not num_heads:
            raise OnnxGradError(f"{op}: rotary_embedding_dim needs num_heads for a 3-D input")
        head = x.shape[-1] // num_heads if num_heads else 2 * half
        if x.shape[-1] % head:
            raise OnnxGradError(f"{op}: hidden size {x.shape[-1]} is not a multiple of the head size {head}")
        x4 = x.reshape(x.shape[0], x.shape[1], -1, head)
    else:
        raise OnnxGradError(f"{op}: input must be 3-D or 4-D, got {list(x.shape)}")
    dim = rotary_embedding_dim or x4.shape[-1]
    if dim != 2 * half or dim > x4.shape[-1]:
        raise OnnxGradError(f"{op}: caches of width {half} do not fit a rotary dimension of {dim} "
                            f"(head size {x4.shape[-1]})")
    pos = rotary_positions(op, position_ids, x4.shape[0], x4.shape[1], x.device)
    if int(pos.max()) >= cos_cache.shape[0] or int(pos.min()) < 0:
        raise OnnxGradError(f"{op}: a position is outside the caches' {cos_cache.shape[0]} rows")
    work = work_dtype(x, float_dtype)
    cos, sin = cos_cache[pos].unsqueeze(2).to(work), sin_cache[pos].unsqueeze(2).to(work)  # (B, S, 1, dim/2)
    y = torch.cat([rotate(x4[..., :dim].to(work), cos, sin, interleaved).to(x.dtype), x4[..., dim:]], -1)
    return y.transpose(1, 2) if x.dim() == 4 else y.reshape(x.shape)
