"""GroupQueryAttention and RotaryEmbedding written out as ai.onnx ops (see engine/ops/contrib_gqa.py for
the kernel semantics they follow)."""
from __future__ import annotations
