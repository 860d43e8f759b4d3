"""Transformer building blocks: Attention (scaled dot product, with masks, caches, GQA, softcap
and sliding windows), RotaryEmbedding and TensorScatter (the external KV-cache update)."""
from __future__ import annotations

import math

import torch

from ..dtypes import onnx_to_torch
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .reduce import stepwise_softmax

# The attention rules' shared step: the softmax backward through the probabilities P.
ATTENTION_BACKWARD = "dS = P ⊙ (dP − rowsum(P ⊙ dP)), dP = dO · Vᵀ, P the attention probabilities"


def _heads(t, n_heads):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = t.shape
    return t.reshape(b, s, n_heads, hidden // n_heads).transpose(1, 2)


def _allowed(q_len, kv_len, offset, device, is_causal, left, right):
    """Boolean (q, kv) or per-batch (B, 1, q, kv) mask of the keys each query may see, or None."""
    if not is_causal and left < 0 and right < 0:
        return None
    i = torch.arange(q_len, device=device).reshape(q_len, 1)
    j = torch.arange(kv_len, device=device).reshape(1, kv_len)
    pos = i + (offset.reshape(-1, 1, 1, 1) if isinstance(offset, torch.Tensor) else offset)
    ok = torch.ones(torch.broadcast_shapes(pos.shape, j.shape), dtype=torch.bool, device=device)
    if is_causal:
        ok = ok & (j <= pos)
    if left >= 0:
        ok = ok & (pos - j <= left)
    if right >= 0:
        ok = ok & (j - pos <= right)
    return ok


def _attention_bias(attn_mask, q_len, kv_len, offset, nonpad, dtype, device, is_causal, left, right):
    """Additive bias (0 or -inf, plus a float mask) broadcastable to (B, H, q, kv)."""
    neg_inf = torch.tensor(-math.inf, dtype=dtype, device=device)
    zero = torch.zeros((), dtype=dtype, device=device)
    bias = torch.zeros((q_len, kv_len), dtype=dtype, device=device)
    if attn_mask is not None:
        pad = kv_len - attn_mask.shape[-1]
        if pad > 0:  # a mask shorter than the keys leaves the rest out
            fill = torch.zeros if attn_mask.dtype == torch.bool else lambda *s, **k: torch.full(s[0], -math.inf, **k)
            attn_mask = torch.cat([attn_mask, fill((*attn_mask.shape[:-1], pad), dtype=attn_mask.dtype,
                                                   device=device)], -1)
        bias = bias + (torch.where(attn_mask, zero, neg_inf) if attn_mask.dtype == torch.bool else attn_mask.to(dtype))
    ok = _allowed(q_len, kv_len, offset, device, is_causal, left, right)
    if nonpad is not None:
        keep = (torch.arange(kv_len, device=device) < nonpad.reshape(-1, 1)).reshape(-1, 1, 1, kv_len)
        ok = keep if ok is None else ok & keep
    if ok is not None:
        bias = bias + torch.where(ok, zero, neg_inf)
    return bias


def _softmax_dtype(softmax_precision, default, float_dtype):
    """softmax_precision, except that a run promoting every float (say to float64) promotes it too."""
    if float_dtype is not None:
        return float_dtype
    return onnx_to_torch(softmax_precision) if softmax_precision else default


def _attention(q, k, v, attn_mask, past_key, past_value, nonpad, *, is_causal, kv_num_heads, q_num_heads,
               qk_matmul_output_mode, scale, softcap, softmax_precision, left_window_size, right_window_size,
               n_outputs, float_dtype=None):
    if (past_key is None) != (past_value is None):
        raise OnnxGradError("Attention: past_key and past_value must be given together")
    if nonpad is not None and past_key is not None:
        raise OnnxGradError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise UnsupportedOpError(f"Attention: qk_matmul_output_mode={qk_matmul_output_mode} is not supported (0-3)")
    rank3 = q.dim() == 3
    if rank3:
        if not q_num_heads or not kv_num_heads:
            raise OnnxGradError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
    elif q.dim() != 4:
        raise OnnxGradError(f"Attention: Q must be 3-D or 4-D, got shape {list(q.shape)}")
    s = torch.tensor(math.sqrt(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale), dtype=q.dtype,
                     device=q.device)
    present_key = k if past_key is None else torch.cat([past_key, k], 2)
    present_value = v if past_value is None else torch.cat([past_value, v], 2)
    q_len, kv_len = q.shape[2], present_key.shape[2]
    if past_key is not None:
        offset = past_key.shape[2]
    elif nonpad is not None:
        offset = nonpad.to(torch.int64).reshape(-1) - q_len
    else:
        offset = 0
    bias = _attention_bias(attn_mask, q_len, kv_len, offset, nonpad, q.dtype, q.device, is_causal,
                           left_window_size, right_window_size)
    keys, values = present_key, present_value
    if q.shape[1] != keys.shape[1]:
        if q.shape[1] % keys.shape[1]:
            raise OnnxGradError(f"Attention: {q.shape[1]} query heads (q_num_heads) are not a multiple of "
                                 f"{keys.shape[1]} kv heads (kv_num_heads)")
        reps = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(reps, 1), values.repeat_interleave(reps, 1)
    raw = torch.matmul(q * s, (keys * s).transpose(-1, -2))
    capped = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    logits = capped + bias
    # NOTE: a row with no visible key gives zeros (not nan) in Y, and zero gradient: its logits are
    # replaced before the softmax so that neither the values nor their derivatives see 0/0.
    dead = torch.isneginf(bias.amax(-1, keepdim=True))
    safe = torch.where(dead, torch.zeros_like(logits), logits)
    work = _softmax_dtype(softmax_precision, safe.dtype, float_dtype)
    probs = stepwise_softmax(safe.to(work), -1)
    probs = torch.where(dead, torch.zeros_like(probs), probs).to(q.dtype)
    y = torch.matmul(probs, values)
    if rank3:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    if n_outputs == 1:
        return y
    qk = (raw, capped, logits, probs)[qk_matmul_output_mode]
    return (y, present_key, present_value, qk)[:n_outputs]


@register("Attention", since=23, until=23)
def attention_23(q, k, v, attn_mask=None, past_key=None, past_value=None, *, is_causal=0, kv_num_heads=None,
                 q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 n_outputs=1, float_dtype=None):
    return _attention(q, k, v, attn_mask, past_key, past_value, None, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision, left_window_size=-1,
                      right_window_size=-1, n_outputs=n_outputs, float_dtype=float_dtype)


@register("Attention", since=24, until=24)
def attention_24(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None, n_outputs=1, float_dtype=None):
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision, left_window_size=-1,
                      right_window_size=-1, n_outputs=n_outputs, float_dtype=float_dtype)


@describe("Attention", needs="in",
          rule=("dQ = scale · dS · K   # " + ATTENTION_BACKWARD,
                "dK = scale · dSᵀ · Q, summed over each group's query heads",
                "dV = Pᵀ · dO, summed over each group's query heads",
                "dattn_mask = dS summed to its shape   # a float mask",
                "dpast_key = the past positions of dK (plus dpresent_key)",
                "dpast_value = the past positions of dV (plus dpresent_value)",
                None))
@register("Attention", since=25)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1, n_outputs=1,
              float_dtype=None):
    if q.dim() == 4 and (q_num_heads or kv_num_heads):
        raise OnnxGradError("Attention: q_num_heads and kv_num_heads are only for 3-D inputs")
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                      scale=scale, softcap=softcap, softmax_precision=softmax_precision,
                      left_window_size=left_window_size, right_window_size=right_window_size, n_outputs=n_outputs,
                      float_dtype=float_dtype)


@describe("RotaryEmbedding", needs="in",
          rule=("dX = dY rotated back by −θ on the rotary dims, dY elsewhere",
                "dcos_cache = scatter-add at the positions of dY₁ · x₁ + dY₂ · x₂",
                "dsin_cache = scatter-add at the positions of dY₂ · x₁ − dY₁ · x₂",
                None))
@register("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    rank3 = x.dim() == 3
    if rank3:
        if not num_heads:
            raise OnnxGradError("RotaryEmbedding: a 3-D input needs num_heads")
        b, s, hidden = x.shape
        x4 = x.reshape(b, s, num_heads, hidden // num_heads)  # (B, S, H, D)
    elif x.dim() == 4:
        x4 = x.transpose(1, 2)
    else:
        raise OnnxGradError(f"RotaryEmbedding: input must be 3-D or 4-D, got shape {list(x.shape)}")
    dim = rotary_embedding_dim or x4.shape[-1]
    rot, rest = x4[..., :dim], x4[..., dim:]
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    if cos_cache.shape[-1] != dim // 2 or sin_cache.shape[-1] != dim // 2:
        whence = f"rotary_embedding_dim {dim}" if rotary_embedding_dim else "the head size, rotary_embedding_dim " \
            "being 0" + (f": input's {x.shape[2]} / num_heads {num_heads}" if rank3 else "")
        raise OnnxGradError(f"RotaryEmbedding: caches end in {cos_cache.shape[-1]}, expected {dim // 2}, half the "
                            f"rotary dim ({whence})")
    cos, sin = cos_cache.unsqueeze(-2), sin_cache.unsqueeze(-2)  # (B or 1, S, 1, dim/2)
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.chunk(2, -1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    rot = torch.stack([real, imag], -1).flatten(-2) if interleaved else torch.cat([real, imag], -1)
    y = torch.cat([rot, rest], -1)
    return y.reshape(x.shape) if rank3 else y.transpose(1, 2)


@describe("TensorScatter", needs="in2",
          rule=("dpast_cache = dY with the written positions zeroed",
                "dupdate = dY gathered from where each update was written",
                None))
@register("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    if mode not in ("linear", "circular"):
        raise UnsupportedOpError(f"TensorScatter: mode {mode!r} is not supported (use linear or circular)")
    axis = axis % past_cache.dim()
    if axis == 0:
        raise OnnxGradError("TensorScatter: axis must not be the batch axis 0")
    batch, length, capacity = past_cache.shape[0], update.shape[axis], past_cache.shape[axis]
    starts = (torch.zeros(batch, dtype=torch.int64, device=past_cache.device) if write_indices is None
              else write_indices.to(torch.int64).reshape(-1))
    pos = starts.reshape(-1, 1) + torch.arange(length, device=past_cache.device)  # (B, length)
    if mode == "circular":
        pos = pos % capacity
    elif bool((pos >= capacity).any()):
        raise OnnxGradError(f"TensorScatter: linear writes past the cache length {capacity}, the size of axis {axis}")
    shape = [batch] + [1] * (past_cache.dim() - 1)
    shape[axis] = length
    index = pos.reshape(shape).expand(update.shape)
    return past_cache.scatter(axis, index, update)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


@describe("LinearAttention", needs="in,out",
          rule=("dquery = scale · dYₜ · Sₜᵀ at each step t   # S the running state, its gradient sent back step by step",
                "dkey = through each step's state update S += k ⊗ v",
                "dvalue = through each step's state update",
                "dpast_state = the state's gradient carried back past the first step",
                "ddecay = through each step's decay of the state (S ← exp(decay) · S)",
                "dbeta = through each step's delta-rule update (v ← beta · (v − Sᵀk))"))
@register("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                     kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta", n_outputs=1):
    if update_rule not in _UPDATE_RULES:
        raise UnsupportedOpError(f"LinearAttention: update_rule {update_rule!r} is not supported "
                                 f"(use {', '.join(_UPDATE_RULES)})")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise OnnxGradError("LinearAttention: q_num_heads must be a positive multiple of kv_num_heads")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise OnnxGradError(f"LinearAttention: update_rule {update_rule!r} needs decay: {gated}, beta: {delta}")
    # The recurrence runs in at least float32, as the reference does, whatever the input type.
    work = torch.promote_types(query.dtype, torch.float32)
    b, t, _ = query.shape
    q, k, v = (_heads(a.to(work), n) for a, n in ((query, q_num_heads), (key, kv_num_heads), (value, kv_num_heads)))
    d_k, d_v = k.shape[-1], v.shape[-1]
    if gated:
        g = decay.to(work).reshape(b, t, kv_num_heads, -1).transpose(1, 2)  # (B, H, T, 1 or d_k)
    if delta:
        gain = beta.to(work).reshape(b, t, beta.shape[-1], 1).transpose(1, 2)  # (B, H or 1, T, 1)
    state = (torch.zeros((b, kv_num_heads, d_k, d_v), dtype=work, device=query.device) if past_state is None
             else past_state.to(work))
    s = 1.0 / math.sqrt(d_k) if not scale else scale
    group = q_num_heads // kv_num_heads
    outs = []
    for i in range(t):
        k_t, v_t = k[:, :, i], v[:, :, i]
        if gated:
            state = state * torch.exp(g[:, :, i]).unsqueeze(-1)
        if delta:
            v_t = gain[:, :, i] * (v_t - torch.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state.repeat_interleave(group, 1) if group > 1 else state
        outs.append(s * torch.einsum("bhd,bhdm->bhm", q[:, :, i], read))
    y = torch.stack(outs, 2).transpose(1, 2).reshape(b, t, q_num_heads * d_v).to(query.dtype)
    present = state.to(query.dtype if past_state is None else past_state.dtype)
    return y if n_outputs == 1 else (y, present)


@describe("CausalConvWithState", needs="in",
          rule=("dinput = the causal depthwise ConvTranspose of dY · act′ with weight   # act = {activation}",
                "dweight = correlate([past_state, input], dY · act′) per channel",
                "dbias = Σ dY · act′ over N and L",
                "dpast_state = the first k − 1 positions of the padded input's gradient"))
@register("CausalConvWithState", since=27)
def causal_conv_with_state(x, weight, bias=None, past_state=None, *, activation="none", n_outputs=1):
    if activation not in ("none", "silu", "swish"):
        raise UnsupportedOpError(f"CausalConvWithState: activation {activation!r} is not supported "
                                 "(use none, silu or swish)")
    if x.dim() != 3 or weight.dim() != 3:
        raise OnnxGradError("CausalConvWithState: input (N, C, L) and weight (C, 1, k) must be 3-D")
    n, c, _ = x.shape
    k = weight.shape[2]
    pad = torch.zeros((n, c, k - 1), dtype=x.dtype, device=x.device) if past_state is None else past_state
    padded = torch.cat([pad, x], 2)
    y = torch.nn.functional.conv1d(padded, weight, bias, groups=c)
    if activation != "none":
        y32 = y.to(torch.promote_types(y.dtype, torch.float32))
        y = (y32 * torch.sigmoid(y32)).to(x.dtype)
    return y if n_outputs == 1 else (y, padded[:, :, padded.shape[2] - (k - 1):])


@describe("FlexAttention", domain="ai.onnx.preview", needs="in",
          rule=("dQ = scale · dS · K   # " + ATTENTION_BACKWARD + "; score_mod and prob_mod differentiated as written",
                "dK = scale · dSᵀ · Q",
                "dV = Pᵀ · dO"))
@register("FlexAttention", domain="ai.onnx.preview", since=1)
def flex_attention(q, k, v, *, scale=None, score_mod=None, prob_mod=None, softmax_precision=None, scope,
                   float_dtype=None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise OnnxGradError("FlexAttention needs rank-4 Q, K and V")
    if q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise OnnxGradError(f"FlexAttention: {q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
        reps = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(reps, 1), v.repeat_interleave(reps, 1)
    s = torch.tensor(math.sqrt(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale), dtype=torch.float32)
    s = s.to(q.dtype)
    # Scores, the modifiers and the softmax run in at least float32 unless softmax_precision says otherwise.
    work = _softmax_dtype(softmax_precision, torch.promote_types(q.dtype, torch.float32), float_dtype)
    scores = torch.matmul(q * s, (k * s).transpose(-1, -2)).to(work)
    if score_mod is not None:
        scores = scope.run(score_mod, [scores])[0].to(work)
    probs = stepwise_softmax(scores, -1)
    if prob_mod is not None:
        probs = scope.run(prob_mod, [probs])[0].to(work)
    return torch.matmul(probs, v.to(work)).to(v.dtype)
