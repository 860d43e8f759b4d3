"""Generated cases of the attention contrib ops: Attention, MultiHeadAttention, GroupQueryAttention and
RotaryEmbedding, over mask formats, caches, packed inputs and the kernels' attributes."""
from __future__ import annotations

import numpy as np

from .contrib_case import make, normal, rng_for
from .contrib_oracles import gqa_qk_norm_reference, mha_unpacked_reference


def _i32(values):
    return np.asarray(values, dtype=np.int32)


def _attention():
    rng = rng_for("Attention")
    out = []
    for k in range(24):
        batch, seq, heads, head = (2, 3, 2, 4) if k % 3 else (1, 4, 3, 2)
        hidden = heads * head
        v_hidden = hidden if k % 8 != 5 else heads * 3
        x = normal(rng, batch, seq, hidden)
        values = {"input": x, "weights": normal(rng, hidden, 2 * hidden + v_hidden, scale=0.5)}
        attrs = {"num_heads": heads}
        if v_hidden != hidden:
            attrs["qkv_hidden_sizes"] = [hidden, hidden, v_hidden]
        if k % 4 != 3:
            values["bias"] = normal(rng, 2 * hidden + v_hidden)
        past = 0
        if k % 5 == 1 and v_hidden == hidden:
            past = 2
            values["past"] = normal(rng, 2, batch, heads, past, head)
        total = past + seq
        mask = k % 6
        if mask == 1:
            values["mask_index"] = _i32(rng.integers(1, total + 1, batch))
        elif mask == 2:
            values["mask_index"] = _i32(np.concatenate([rng.integers(2, total + 1, batch), rng.integers(0, 2, batch)]))
        elif mask == 3:
            values["mask_index"] = _i32(rng.integers(0, 2, (batch, total)))
        elif mask == 4:
            values["mask_index"] = _i32(rng.integers(0, 2, (batch, seq, total)))
        if k % 4 == 1:
            attrs["unidirectional"] = 1
        if k % 7 == 2 and not past:  # the kernel refuses past with attention_bias
            values["attention_bias"] = normal(rng, 1 if k % 2 else batch, heads, seq, total)
        if k % 9 == 4:
            attrs["scale"] = 0.3
        if k % 10 == 7 and mask:
            attrs["mask_filter_value"] = -40.0
        n_out = 2 if "past" in values or k % 6 == 0 else 1
        label = f"{batch}x{seq}x{hidden}-h{heads}-mask{mask}" + "".join(
            f"-{n}" for n in ("bias", "past", "attention_bias") if n in values) + "".join(
            f"-{a}" for a in ("unidirectional", "scale", "mask_filter_value", "qkv_hidden_sizes") if a in attrs) + \
            f"-out{n_out}"
        out.append(make("Attention", label, values, attrs, n_outputs=n_out))
    return out


def _multi_head_attention():
    rng = rng_for("MultiHeadAttention")
    out = []
    forms = ["separate", "cross", "packed_qkv", "packed_kv", "bnsh_kv", "separate"]
    for k in range(24):
        form = forms[k % len(forms)]
        batch, seq, heads, head = (2, 3, 2, 4) if k % 2 else (1, 4, 2, 3)
        hidden = heads * head
        kv_len = seq if form in ("separate", "packed_qkv") else seq + 2
        values, attrs = {}, {"num_heads": heads}
        if form == "packed_qkv":
            values["query"] = normal(rng, batch, seq, heads, 3, head)
        else:
            values["query"] = normal(rng, batch, seq, hidden)
        if form in ("separate", "cross"):
            values["key"], values["value"] = normal(rng, batch, kv_len, hidden), normal(rng, batch, kv_len, hidden)
        elif form == "packed_kv":
            values["key"] = normal(rng, batch, kv_len, heads, 2, head)
        elif form == "bnsh_kv":
            values["key"], values["value"] = (normal(rng, batch, heads, kv_len, head),
                                              normal(rng, batch, heads, kv_len, head))
        if form in ("separate", "cross", "packed_kv") and k % 3 != 2:
            values["bias"] = normal(rng, 3 * hidden)
        past = 0
        if form == "separate" and k % 4 == 0:
            past = 2
            values["past_key"], values["past_value"] = (normal(rng, batch, heads, past, head),
                                                        normal(rng, batch, heads, past, head))
        total = past + kv_len
        if k % 5 == 1:
            values["key_padding_mask"] = _i32(rng.integers(1, total + 1, batch))
        elif k % 5 == 3:
            values["key_padding_mask"] = _i32(rng.integers(0, 2, (batch, total)))
        if k % 7 == 3:
            values["attention_bias"] = normal(rng, 1 if k % 2 else batch, heads, seq, total)
        if k % 4 == 2 and form in ("separate",):
            attrs["unidirectional"] = 1
        if k % 6 == 5:
            attrs["scale"] = 0.25
        if k % 8 == 1 and "key_padding_mask" in values:
            attrs["mask_filter_value"] = -30.0
        n_out = 3 if past else (1 if k % 3 else 3)
        if form == "separate" and (k % 4 == 1 or k == 6):
            n_out = 4  # the qk output: scaled Q·Kᵀ
        if form == "bnsh_kv":
            n_out = 1
        label = f"{form}-{batch}x{seq}x{hidden}-kv{kv_len}" + "".join(
            f"-{n}" for n in ("bias", "past_key", "key_padding_mask", "attention_bias") if n in values) + "".join(
            f"-{a}" for a in ("unidirectional", "scale", "mask_filter_value") if a in attrs) + f"-out{n_out}"
        reference = mha_unpacked_reference if form.startswith("packed") else None
        out.append(make("MultiHeadAttention", label, values, attrs, n_outputs=n_out, reference=reference))
    return out


def _rope_caches(rng, length, half):
    angles = rng.uniform(0, 2 * np.pi, (length, half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# long: 24 cases from one loop, each input and attribute switched on by its own pattern in k (read top to bottom)
def _group_query_attention():
    rng = rng_for("GroupQueryAttention")
    out = []
    for k in range(24):
        heads, kv_heads, head = ((4, 2, 16), (2, 1, 8), (4, 4, 8))[k % 3]  # the kernel's multiples of 8 (16 with rotary)
        decode = k % 4 in (1, 2)
        batch = 2 if (decode and k % 2) or not decode else 1
        seq = 1 if decode and batch > 1 else (3 if decode else 4)
        past_len = 5 if decode else 0
        static = decode and k % 8 == 2  # a static cache longer than needed
        buffer = 8 if static else past_len
        q = normal(rng, batch, seq, heads * head)
        key, value = normal(rng, batch, seq, kv_heads * head), normal(rng, batch, seq, kv_heads * head)
        if decode:
            lengths = np.full(batch, past_len + seq) - (np.arange(batch) % 2) * 2
            total = buffer if static else past_len + seq
        else:
            lengths = np.full(batch, seq) - (k % 5 == 4) * np.arange(batch)  # a padded prompt row
            total = seq
        values = {"seqlens_k": _i32(lengths - 1), "total_sequence_length": _i32(total)}
        if k % 6 == 5 and not decode:
            values["query"] = np.concatenate([q, key, value], -1)
        else:
            values.update(query=q, key=key, value=value)
        if decode:
            values["past_key"], values["past_value"] = (normal(rng, batch, kv_heads, buffer, head),
                                                        normal(rng, batch, kv_heads, buffer, head))
        attrs = {"num_heads": heads, "kv_num_heads": kv_heads}
        if k % 3 == 0:
            attrs["do_rotary"] = 1
            values["cos_cache"], values["sin_cache"] = _rope_caches(rng, 16, head // 2)
            if k % 6 == 3:
                attrs["rotary_interleaved"] = 1
        if k % 7 == 2:
            attrs["local_window_size"] = 2
        if k % 5 == 1 or k == 20:
            attrs["softcap"] = 1.5
        if k % 8 == 6:
            attrs["smooth_softmax"] = 1
        if k % 9 == 4:
            values["head_sink"] = normal(rng, heads)
        if k % 10 == 3:
            attrs["scale"] = 0.3
        if k % 11 == 7:
            values["attention_bias"] = normal(rng, 1, heads, seq, values["total_sequence_length"].item()
                                              if not decode else (buffer if static else past_len + seq))
        if k % 12 == 8 and "local_window_size" not in attrs:
            attrs["causal"] = 0
        if k % 6 == 1 and "key" in values:
            values["q_norm_weight"], values["k_norm_weight"] = normal(rng, head, shift=1.0), normal(rng, head, shift=1.0)
        if attrs.get("do_rotary") and k % 4 in (2, 3):
            values["position_ids"] = rng.integers(0, 16 - seq, (batch, seq)).astype(np.int64)
        n_out = 3 if k % 2 == 0 or decode else 1
        if k % 5 in (0, 2) and not decode:
            attrs["qk_output"] = 1 + k % 2
            n_out = 4
        label = f"{'decode' if decode else 'prompt'}-b{batch}s{seq}-h{heads}/{kv_heads}x{head}" + \
            ("-static" if static else "") + ("-packed" if "key" not in values else "") + \
            ("-padded" if (not decode and k % 5 == 4) else "") + "".join(
            f"-{n}" for n in ("attention_bias", "q_norm_weight", "position_ids") if n in values) + "".join(
            f"-{a}{v if a not in ('do_rotary', 'smooth_softmax', 'causal') else ''}" for a, v in attrs.items()
            if a not in ("num_heads", "kv_num_heads")) + ("-head_sink" if "head_sink" in values else "") + f"-out{n_out}"
        xs = [n for n in ("query", "key", "value", "past_key", "past_value", "head_sink", "attention_bias", "q_norm_weight",
                          "k_norm_weight", "cos_cache", "sin_cache") if n in values]
        reference = gqa_qk_norm_reference if "q_norm_weight" in values else None
        out.append(make("GroupQueryAttention", label, values, attrs, n_outputs=n_out, xs=xs, reference=reference))
    return out


def _rotary_embedding():
    rng = rng_for("RotaryEmbedding")
    out = []
    for k in range(20):
        batch, seq, heads, head = (2, 3, 2, 8) if k % 2 else (1, 4, 3, 4)
        partial = k % 5 == 3
        dim = head // 2 if partial else head
        cos, sin = _rope_caches(rng, 10, dim // 2)
        four_d = k % 4 == 2
        x = normal(rng, batch, heads, seq, head) if four_d else normal(rng, batch, seq, heads * head)
        if k % 3 == 0:
            positions = np.array([k % 4], np.int64)
        else:
            positions = rng.integers(0, 10, (batch, seq)).astype(np.int64)
        attrs = {}
        if k % 2 == 0:
            attrs["interleaved"] = 1
        if partial or (k % 7 == 1 and not four_d):
            attrs["num_heads"] = heads
        if partial:
            attrs["rotary_embedding_dim"] = dim
        if k % 9 == 5:
            attrs["scale"] = 0.5
        values = {"input": x, "position_ids": positions, "cos_cache": cos, "sin_cache": sin}
        label = f"{'4d' if four_d else '3d'}-{batch}x{seq}-h{heads}x{head}-pos{'x'.join(map(str, positions.shape))}" + \
            "".join(f"-{a}{v}" for a, v in attrs.items())
        out.append(make("RotaryEmbedding", label, values, attrs))
    return out


def attention_cases():
    return _attention() + _multi_head_attention() + _group_query_attention() + _rotary_embedding()
