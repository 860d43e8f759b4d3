"""Attention, MultiHeadAttention, EmbedLayerNormalization and DynamicQuantizeMatMul written out as ai.onnx
ops (see engine/ops/contrib_attention.py and contrib_quant.py for the kernel semantics they follow)."""
from __future__ import annotations
