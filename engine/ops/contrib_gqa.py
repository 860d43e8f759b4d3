"""onnxruntime's GroupQueryAttention (com.microsoft): the decoder attention of LLM exports, with a KV
cache, grouped key/value heads, in-kernel rotary embedding, sliding windows, softcap and sinks.

Lengths follow the CPU kernel: batch b holds seqlens_k[b] + 1 valid tokens in total; on the first
prompt (no past, or an empty one) the new tokens start at position 0, otherwise at
total - sequence_length. Query s sees keys j <= past + s that are also below the total (padded
prompt rows see only the valid keys), and only the last local_window_size of them when set. present_key/value hold the
past, then the new keys, then zeros, over total_sequence_length positions (or the past buffer's
length when it is a static cache).
"""
from __future__ import annotations

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register, validates
from .attention import ATTENTION_BACKWARD
from .contrib_attention import merge_heads, rotate, scores_scale, split_heads, work_dtype

MS = "com.microsoft"
_REFUSED = ("kv_cache_bit_width", "k_quant_type", "v_quant_type")


def _rms_per_head(t, weight, epsilon):
    """Qwen3-style RMS norm of each head's vector, before the rotary embedding."""
    return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + epsilon) * weight.to(t.dtype)


def _split_inputs(op, query, key, value, num_heads, kv_num_heads, work):
    if key is None and value is None:  # packed (B, S, (N + 2·Nkv)·H)
        head = query.shape[-1] // (num_heads + 2 * kv_num_heads)
        q, k, v = query.to(work).split([num_heads * head, kv_num_heads * head, kv_num_heads * head], -1)
    else:
        q, k, v = query.to(work), key.to(work), value.to(work)
    return split_heads(q, num_heads), split_heads(k, kv_num_heads), split_heads(v, kv_num_heads)


def _cache_lengths(op, past_key, seqlens_k, total_sequence_length, q_len, batch):
    """(past length per batch, present length): the kernel's prompt / token-generation rules."""
    total = seqlens_k.reshape(-1).long() + 1
    total_max = int(total_sequence_length.reshape(-1)[0])
    buffer = 0 if past_key is None else past_key.shape[2]
    if buffer == 0:
        return torch.zeros_like(total), total_max, total
    if q_len > 1 and batch > 1:
        raise OnnxGradError(f"{op}: batch_size must be 1 when sequence_length > 1 and past context is given "
                            "(the kernel's rule)")
    if total_max != buffer + q_len and total_max > buffer:
        raise OnnxGradError(f"{op}: total_sequence_length {total_max} must equal past + new lengths "
                            f"({buffer} + {q_len}) or fit in a static cache of {buffer}")
    past = total - q_len
    if int(past.min()) < 0:
        raise OnnxGradError(f"{op}: seqlens_k + 1 is shorter than the {q_len} new tokens")
    return past, max(total_max, buffer), total


def _present(past_cache, new, past_len, length, work):
    """Per batch: the valid past, the new keys after it, zeros to `length`."""
    b, n, s, h = new.shape
    out = []
    for i in range(b):
        p = int(past_len[i])
        parts = [new[i]]
        if p:
            parts.insert(0, past_cache[i, :, :p].to(work))
        rest = length - p - s
        if rest < 0:
            raise OnnxGradError(f"GroupQueryAttention: {p} past and {s} new tokens overflow the cache of {length}")
        if rest:
            parts.append(torch.zeros((n, rest, h), dtype=work, device=new.device))
        out.append(torch.cat(parts, 1))
    return torch.stack(out)


def _together(ins, *names):
    if len({ins.given(n) for n in names}) > 1:
        missing = next(n for n in names if not ins.given(n))
        ins.fail(missing, f"is missing: {' and '.join(map(repr, names))} are given together or not at all")


@validates("GroupQueryAttention", domain=MS)
def _gqa_inputs(ins, *, num_heads, kv_num_heads, do_rotary=0, **_):
    """onnxruntime's CheckInputs (group_query_attention_helper.h): the layout of every input."""
    if kv_num_heads <= 0 or num_heads % kv_num_heads:
        ins.fail("query", f"num_heads {num_heads} is not a multiple of kv_num_heads {kv_num_heads}")
    batch, seq, hidden = ins.rank("query", 3, layout="batch, sequence, hidden")
    _together(ins, "key", "value")
    packed = not ins.given("key")
    heads = num_heads + 2 * kv_num_heads if packed else num_heads  # what query's hidden size holds
    if hidden % heads:
        ins.fail("query", f"dim 2 is {hidden}, expected a multiple of "
                          + (f"num_heads + 2·kv_num_heads = {heads} (packed QKV)" if packed else f"num_heads {heads}"))
    head = hidden // heads
    whence = f"the head size: query's {hidden} / {'num_heads + 2·kv_num_heads' if packed else 'num_heads'} {heads}"
    for name in () if packed else ("key", "value"):
        ins.rank(name, 3, layout="batch, sequence, kv hidden")
        ins.dim(name, 0, batch, "the batch size, query's dim 0")
        ins.dim(name, 1, seq, "the sequence length, query's dim 1")
        ins.dim(name, 2, kv_num_heads * head, f"kv_num_heads {kv_num_heads} × head size {head}, query's {hidden} / "
                                              f"num_heads {num_heads}")
    _together(ins, "past_key", "past_value")
    for name in ("past_key", "past_value"):
        ins.rank(name, 4, layout="batch, kv_num_heads, max length, head size")
        ins.dim(name, 0, batch, "the batch size, query's dim 0")
        ins.dim(name, 1, kv_num_heads, "kv_num_heads")
        ins.dim(name, 3, head, whence)
    if ins.given("past_key"):
        ins.dim("past_value", 2, ins.shape("past_key")[2], "past_key's dim 2, the cache length")
    for name in ("seqlens_k", "total_sequence_length"):
        if not ins.given(name):
            ins.fail(name, "is required")
        ins.dtype(name, torch.int32)
    ins.rank("seqlens_k", 1, layout="batch")
    ins.dim("seqlens_k", 0, batch, "the batch size, query's dim 0")
    if ins["total_sequence_length"].numel() != 1:
        ins.fail("total_sequence_length", "expected a scalar")
    _gqa_rotary_inputs(ins, batch, seq, head, num_heads, do_rotary)


def _gqa_rotary_inputs(ins, batch, seq, head, num_heads, do_rotary):
    """The caches, bias, sink and per-head norms: their widths follow the head size."""
    _together(ins, "cos_cache", "sin_cache")
    if do_rotary and not ins.given("cos_cache"):
        ins.fail("cos_cache", "is required when do_rotary is 1")
    for name in ("cos_cache", "sin_cache"):
        ins.rank(name, 2, layout="max position, rotary dim / 2")
    if ins.given("cos_cache"):
        half = ins.shape("cos_cache")[1]
        if 2 * half > head:
            ins.fail("cos_cache", f"dim 1 is {half}, expected at most {head // 2} (half the head size {head})")
        ins.dim("sin_cache", 1, half, "cos_cache's dim 1")
    if ins.given("attention_bias"):
        past = ins.shape("past_key")[2] if ins.given("past_key") else 0
        total = max(ins.value("total_sequence_length"), past)
        ins.rank("attention_bias", 4, layout="batch or 1, num_heads or 1, sequence, total length")
        ins.broadcasts("attention_bias", (batch, num_heads, seq, total),
                       "batch, num_heads, sequence, total_sequence_length")
    ins.width("head_sink", num_heads, "one logit per query head")
    _together(ins, "q_norm_weight", "k_norm_weight")
    ins.width("q_norm_weight", head, "one weight per element of a head")
    ins.width("k_norm_weight", head, "one weight per element of a head")


# The kernel's steps in its order (refusals, cache lengths, q/k norms, rotary, present caches, masks, sink,
# outputs), each checked against onnxruntime. long: split, the steps would hand a dozen tensors along.
@describe("GroupQueryAttention", domain=MS, needs="in",
          rule=("dquery = scale · dS · K, through the rotary and q-norm backward   # " + ATTENTION_BACKWARD,
                "dkey = scale · dSᵀ · Q summed over each group's query heads, through the rotary backward",
                "dvalue = Pᵀ · dO summed over each group's query heads",
                "dpast_key = the valid past positions of dpresent_key",
                "dpast_value = the valid past positions of dpresent_value",
                None,
                None,
                "dcos_cache = scatter-add at the positions of the rotary backward",
                "dsin_cache = likewise",
                None,
                "dattention_bias = dS summed to its shape",
                "dhead_sink = −Σ p_sink · rowsum(P ⊙ dP)   # the sink's share",
                None,
                None,
                "dq_norm_weight = Σ dq̃ · q̂ per head   # the RMS norm before the rotary",
                "dk_norm_weight = Σ dk̃ · k̂ per head",
                None))
@register("GroupQueryAttention", domain=MS, since=1)
def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                          total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                          attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
                          k_norm_weight=None, query_seqlens=None, *, num_heads, kv_num_heads, causal=1, do_rotary=0,
                          rotary_interleaved=0, local_window_size=-1, scale=None, softcap=0.0, smooth_softmax=-1,
                          qk_output=0, qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None,
                          kv_cache_bit_width=0, k_quant_type="NONE", v_quant_type="NONE", sliding_window_cache=0,
                          n_outputs=1, float_dtype=None):
    op = "GroupQueryAttention"
    if kv_cache_bit_width or k_quant_type != "NONE" or v_quant_type != "NONE" or k_scale is not None \
            or v_scale is not None:
        raise UnsupportedOpError(f"{op}: a quantized KV cache ({', '.join(_REFUSED)}, k_scale, v_scale) is not "
                                 "supported")
    if sliding_window_cache:
        raise UnsupportedOpError(f"{op}: sliding_window_cache=1 (window-sized ring buffers) is not supported")
    if query_seqlens is not None:
        raise UnsupportedOpError(f"{op}: query_seqlens (right-padded chunked prefill) is not supported")
    if not causal and local_window_size != -1:
        raise OnnxGradError(f"{op}: local_window_size must be -1 when causal is 0")
    if qk_output not in (0, 1, 2):
        raise UnsupportedOpError(f"{op}: qk_output={qk_output} is not supported (0, 1 or 2)")
    work = work_dtype(query, float_dtype)
    q, k, v = _split_inputs(op, query, key, value, num_heads, kv_num_heads, work)
    batch, q_len, head = q.shape[0], q.shape[2], q.shape[3]
    past, length, total = _cache_lengths(op, past_key, seqlens_k, total_sequence_length, q_len, batch)
    if q_norm_weight is not None:
        q = _rms_per_head(q, q_norm_weight, qk_norm_epsilon if q_norm_epsilon is None else q_norm_epsilon)
        k = _rms_per_head(k, k_norm_weight, qk_norm_epsilon if k_norm_epsilon is None else k_norm_epsilon)
    device = query.device
    steps = torch.arange(q_len, device=device)
    if do_rotary:
        if position_ids is None:
            pos = past.reshape(-1, 1) + steps.reshape(1, -1)
        elif past_key is None or past_key.shape[2] == 0:
            # NOTE: on the first prompt the kernel reads only position_ids' first element, for every batch.
            pos = position_ids.reshape(-1)[0].long() + steps.reshape(1, -1)
        else:
            pos = position_ids.long().reshape(batch, q_len)
        if int(pos.max()) >= cos_cache.shape[0]:
            raise OnnxGradError(f"{op}: a position is outside the caches' {cos_cache.shape[0]} rows")
        dim = 2 * cos_cache.shape[-1]
        cos, sin = cos_cache[pos].unsqueeze(1).to(work), sin_cache[pos].unsqueeze(1).to(work)  # (B, 1, S, dim/2)
        q = torch.cat([rotate(q[..., :dim], cos, sin, rotary_interleaved), q[..., dim:]], -1)
        k = torch.cat([rotate(k[..., :dim], cos, sin, rotary_interleaved), k[..., dim:]], -1)
    present_k = _present(past_key, k, past, length, work)
    present_v = _present(past_value, v, past, length, work)
    group = num_heads // kv_num_heads
    keys, values = present_k.repeat_interleave(group, 1), present_v.repeat_interleave(group, 1)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scores_scale(scale, head)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if attention_bias is not None:
        scores = scores + attention_bias.to(work)
    j = torch.arange(length, device=device).reshape(1, 1, 1, -1)
    query_pos = past.reshape(-1, 1, 1, 1) + steps.reshape(1, 1, -1, 1)
    visible = j < total.reshape(-1, 1, 1, 1)
    if causal:
        visible = visible & (j <= query_pos)
        if local_window_size > 0:
            visible = visible & (j > query_pos - local_window_size)  # the window counts the query's own key
    neg = torch.full((), float("-inf"), dtype=work, device=device)
    logits = torch.where(visible, scores, neg)
    sink = None
    if head_sink is not None:
        sink = head_sink.to(work).reshape(1, -1, 1, 1).expand(batch, num_heads, q_len, 1)
    elif smooth_softmax == 1:  # a zero logit in every denominator
        sink = torch.zeros((batch, num_heads, q_len, 1), dtype=work, device=device)
    if sink is not None:
        probs = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(logits, -1)
    y = merge_heads(torch.matmul(probs, values)).to(query.dtype)
    if n_outputs == 1:
        return y
    outputs = [y, present_k.to(query.dtype), present_v.to(query.dtype)]
    if n_outputs > 3:
        if not qk_output:
            raise OnnxGradError(f"{op}: output_qk is declared but qk_output is 0")
        # qk_output 1: the scores the softmax saw, 0 for the keys it did not see
        qk = torch.where(visible, scores, torch.zeros((), dtype=work, device=device)) if qk_output == 1 else probs
        outputs.append(qk.to(query.dtype))
    return tuple(outputs[:n_outputs])
