"""Small LLMs with past key values, built in code, shaped as the exporters write them: optimum's
(a mask over `past_sequence_length + sequence_length`, position ids, past keys joined by Concat)
and onnxruntime-genai's (a packed GroupQueryAttention with rotary, a `kv_cache_dim` head size and
a total_sequence_length mask the graph turns into seqlens_k itself)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, POSITIONS = 11, 16
PAST_OPTIMUM = "past_sequence_length + sequence_length"


def _int(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.INT64, shape)


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _inits(rng, **shapes):
    return [numpy_helper.from_array((0.5 * rng.standard_normal(s)).astype(np.float32), n) for n, s in shapes.items()]


def _heads(src: str, out: str, heads: int, head: int) -> list:
    """[B, S, heads*head] -> [B, heads, S, head]."""
    return [helper.make_node("Reshape", [src, "split_shape"], [out + "_r"]),
            helper.make_node("Transpose", [out + "_r"], [out], perm=[0, 2, 1, 3])]


def optimum_llm(mask_dim: str = PAST_OPTIMUM) -> onnx.ModelProto:
    """One attention layer (2 heads of 4) over the past and current positions, with a learned
    position table of POSITIONS rows: a position past it fails the Gather. Older optimum wrote the
    mask's length as `past_sequence_length + 1`."""
    rng = np.random.default_rng(3)
    batch, seq, past = "batch_size", "sequence_length", "past_sequence_length"
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["tok"], name="embed"),
        helper.make_node("Gather", ["pos_table", "position_ids"], ["pos"], name="positions"),
        helper.make_node("Add", ["tok", "pos"], ["h"]),
        *[n for w in "qkv" for n in [helper.make_node("MatMul", ["h", f"W{w}"], [f"{w}_flat"])]
          + _heads(f"{w}_flat", w, 2, 4)],
        helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=2, name="keys"),
        helper.make_node("Concat", ["past_key_values.0.value", "v"], ["present.0.value"], axis=2, name="values"),
        helper.make_node("Transpose", ["present.0.key"], ["kT"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kT"], ["scores"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "mask_axes"], ["mask4"]),
        helper.make_node("Sub", ["mask4", "one"], ["hidden"]),
        helper.make_node("Mul", ["hidden", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present.0.value"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["ctx_flat"]),
        helper.make_node("MatMul", ["ctx_flat", "Wo"], ["logits"]),
    ]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("split_shape", [0, 0, 2, 4]), ("merge_shape", [0, 0, 8]), ("mask_axes", [1, 2]))]
    consts += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("one", 1.0), ("big", 1e4))]
    g = helper.make_graph(
        nodes, "optimum_llm",
        [_int("input_ids", [batch, seq]), _int("attention_mask", [batch, mask_dim]), _int("position_ids", [batch, seq]),
         _float("past_key_values.0.key", [batch, 2, past, 4]), _float("past_key_values.0.value", [batch, 2, past, 4])],
        [_float("logits", [batch, seq, VOCAB]), _float("present.0.key", [batch, 2, mask_dim, 4]),
         _float("present.0.value", [batch, 2, mask_dim, 4])],
        _inits(rng, embed=(VOCAB, 8), pos_table=(POSITIONS, 8), Wq=(8, 8), Wk=(8, 8), Wv=(8, 8), Wo=(8, VOCAB)) + consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


HEADS, KV_HEADS, HEAD = 2, 1, 16  # onnxruntime's GroupQueryAttention wants a head size of 16 with rotary


def genai_llm(rotary: bool = True, length_inputs: bool = False) -> onnx.ModelProto:
    """Packed QKV into GroupQueryAttention (num_heads 2, kv_num_heads 1, head size 16 that only the
    weights and attributes tell), seqlens_k and the total length computed from the mask, or (as
    older builders wrote it) graph inputs themselves."""
    rng = np.random.default_rng(4)
    batch, seq, past, total, cache = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length", \
        "kv_cache_dim"
    hidden, width = HEADS * HEAD, (HEADS + 2 * KV_HEADS) * HEAD
    attrs = {"num_heads": HEADS, "kv_num_heads": KV_HEADS, **({"do_rotary": 1} if rotary else {})}
    caches = ["cos_cache", "sin_cache"] if rotary else []
    lengths = ["seqlens_k", "total_sequence_length"] if length_inputs else ["seqlens_k", "total_len"]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "Wqkv"], ["qkv"], name="qkv_proj"),
    ] + ([] if length_inputs else [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["lengths"], keepdims=0),
        helper.make_node("Sub", ["lengths", "one64"], ["last"]),
        helper.make_node("Cast", ["last"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one_scalar"], ["total64"], axis=0),
        helper.make_node("Cast", ["total64"], ["total_len"], to=TensorProto.INT32)]) + [
        helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key_values.0.key", "past_key_values.0.value",
                                                 *lengths, *caches],
                         ["attn", "present.0.key", "present.0.value"], domain="com.microsoft", name="gqa", **attrs),
        helper.make_node("MatMul", ["attn", "Wo"], ["logits"]),
    ]
    angles = rng.uniform(0, 2 * np.pi, (POSITIONS, HEAD // 2))
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("axis1", [1]), ("one64", 1), ("one_scalar", 1))]
    if rotary:
        consts += [numpy_helper.from_array(f(angles).astype(np.float32), n) for n, f in (("cos_cache", np.cos),
                                                                                         ("sin_cache", np.sin))]
    mask = [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [batch]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])] if length_inputs \
        else [_int("attention_mask", [batch, total])]
    g = helper.make_graph(
        nodes, "genai_llm",
        [_int("input_ids", [batch, seq]), *mask,
         _float("past_key_values.0.key", [batch, KV_HEADS, past, cache]),
         _float("past_key_values.0.value", [batch, KV_HEADS, past, cache])],
        [_float("logits", [batch, seq, VOCAB]), _float("present.0.key", [batch, KV_HEADS, total, cache]),
         _float("present.0.value", [batch, KV_HEADS, total, cache])],
        _inits(rng, embed=(VOCAB, hidden), Wqkv=(hidden, width), Wo=(hidden, VOCAB)) + consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def merged_decoder() -> onnx.ModelProto:
    """The inputs of optimum's merged seq2seq decoder (self-attention past over
    past_decoder_sequence_length, cross-attention cache over encoder_sequence_length,
    use_cache_branch), with a body that reads each: the caches' sum only on the with-past branch."""
    rng = np.random.default_rng(5)
    batch, dec, past, enc = "batch_size", "decoder_sequence_length", "past_decoder_sequence_length", \
        "encoder_sequence_length"
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["tok"]),
        helper.make_node("Concat", [f"past_key_values.0.{side}.{kind}" for side in ("decoder", "encoder")
                                    for kind in ("key", "value")], ["caches"], axis=2),
        helper.make_node("ReduceSum", ["caches"], ["both"], keepdims=0),
        helper.make_node("Where", ["use_cache_branch", "both", "zero"], ["gate"]),
        helper.make_node("MatMul", ["encoder_hidden_states", "Wc"], ["ctx"]),
        helper.make_node("ReduceMean", ["ctx"], ["ctx_mean"], axes=[1]),
        helper.make_node("Add", ["tok", "ctx_mean"], ["h"]),
        helper.make_node("Mul", ["h", "gate"], ["logits"]),
    ]
    kv = [_float(f"past_key_values.0.{side}.{kind}", [batch, 2, length, 4])
          for side, length in (("decoder", past), ("encoder", enc)) for kind in ("key", "value")]
    g = helper.make_graph(
        nodes, "merged_decoder",
        [_int("input_ids", [batch, dec]), _float("encoder_hidden_states", [batch, enc, 8]), *kv,
         helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])],
        [_float("logits", [batch, dec, 8])],
        _inits(rng, embed=(VOCAB, 8), Wc=(8, 8)) + [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
