"""The formal input and output names of the onnxruntime contrib ops we run (onnx's own schema registry
has none of them): step mode names each rule line's tensor with them, and the conformance sweep
builds its cases from them. tests/ops/test_contrib.py holds this table to onnxruntime's schemas.
"""
from __future__ import annotations

MS = "com.microsoft"

# (domain, op) -> (inputs, outputs), in schema order.
SIGNATURES: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {
    (MS, "Gelu"): (("X",), ("Y",)),
    (MS, "BiasGelu"): (("A", "B"), ("C",)),
    (MS, "FastGelu"): (("X", "bias"), ("Y",)),
    (MS, "QuickGelu"): (("X",), ("Y",)),
    (MS, "BiasAdd"): (("X", "bias", "skip"), ("Y",)),
    (MS, "BiasSplitGelu"): (("X", "bias"), ("Y",)),
    (MS, "GemmFastGelu"): (("X", "W", "bias"), ("Y",)),
    (MS, "FusedMatMul"): (("A", "B"), ("Y",)),
    (MS, "FusedConv"): (("X", "W", "B", "Z"), ("Y",)),
    (MS, "SkipLayerNormalization"): (("input", "skip", "gamma", "beta", "bias"),
                                     ("output", "mean", "inv_std_var", "input_skip_bias_sum")),
    (MS, "SkipSimplifiedLayerNormalization"): (("input", "skip", "gamma", "bias"),
                                               ("output", "mean", "inv_std_var", "input_skip_bias_sum")),
    ("", "SimplifiedLayerNormalization"): (("X", "scale"), ("Y", "inv_std_var")),
    ("", "LayerNormalization"): (("X", "Scale", "B"), ("Y", "Mean", "InvStdDev")),  # opsets 1-16: onnxruntime's
    (MS, "EmbedLayerNormalization"): (("input_ids", "segment_ids", "word_embedding", "position_embedding",
                                       "segment_embedding", "gamma", "beta", "mask", "position_ids"),
                                      ("output", "mask_index", "embedding_sum")),
    (MS, "Attention"): (("input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length"),
                        ("output", "present")),
    (MS, "MultiHeadAttention"): (("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key",
                                  "past_value", "past_sequence_length", "cache_indirection"),
                                 ("output", "present_key", "present_value", "qk")),
    (MS, "GroupQueryAttention"): (("query", "key", "value", "past_key", "past_value", "seqlens_k",
                                   "total_sequence_length", "cos_cache", "sin_cache", "position_ids", "attention_bias",
                                   "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight",
                                   "query_seqlens"),
                                  ("output", "present_key", "present_value", "output_qk")),
    (MS, "RotaryEmbedding"): (("input", "position_ids", "cos_cache", "sin_cache"), ("output",)),
    (MS, "MatMulNBits"): (("A", "B", "scales", "zero_points", "g_idx", "bias"), ("Y",)),
    (MS, "GatherBlockQuantized"): (("data", "indices", "scales", "zero_points"), ("output",)),
    (MS, "DynamicQuantizeMatMul"): (("A", "B", "b_scale", "b_zero_point", "bias"), ("Y",)),
    (MS, "MatMulIntegerToFloat"): (("A", "B", "a_scale", "b_scale", "a_zero_point", "b_zero_point", "bias"), ("Y",)),
}


# onnxruntime registers these in the default domain, where onnx's checker does not know them (or not at
# these opsets): op -> (first, last) default-domain opset. The optimizer writes them into the files it fuses.
DEFAULT_DOMAIN_OPS: dict[str, tuple[int, int | None]] = {
    "SimplifiedLayerNormalization": (1, None),
    "LayerNormalization": (1, 16),
}


def is_default_domain_contrib(op_type: str, opset: int) -> bool:
    span = DEFAULT_DOMAIN_OPS.get(op_type)
    return span is not None and span[0] <= opset and (span[1] is None or opset <= span[1])


def signature(domain: str, op_type: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(input names, output names) of a contrib op, or None for an op this table does not hold."""
    return SIGNATURES.get(("" if domain == "ai.onnx" else domain, op_type))
