"""Lower a JVP to standard ONNX: J·v as plain ai.onnx ops beside the forward pass, for any runtime.

    lower_jvp(model, y, xs, zs=None, tangents=None, name=None) -> onnx.ModelProto

Forward rules live one module per op family and fill FORWARD; an op without one goes through its
backward rule transposed (core.py).
"""
from . import activation, elementwise, linear, reduce  # noqa: F401  (fill the registry)
from .build import lower_jvp, lowered_jvp
from .registry import FORWARD, jvp_rule

__all__ = ["lower_jvp", "lowered_jvp", "FORWARD", "jvp_rule"]
