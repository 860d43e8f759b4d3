"""Lower Gradient to standard ONNX: the backward graph as plain ai.onnx ops any runtime can execute.

    lower(model, y=None, xs=None, zs=None, dy=None, names=None) -> onnx.ModelProto
    lower_jvp(model, y, xs, zs=None, tangents=None, name=None) -> onnx.ModelProto (forward mode, jvp/)
    supported_ops() -> the op types that have a backward rule

The rules live one module per op family, mirroring engine/ops; importing them fills BACKWARD.
`engine.lower(model, ...)` is this package's `lower`.
"""
from . import (  # noqa: F401  (fill the registry)
    activation,
    attention,
    control,
    conv,
    elementwise,
    indexing,
    nn,
    norm,
    pool,
    quantize,
    reduce,
    resize,
    rnn,
    sampling,
    sequence,
    shape,
    signal,
)
from .build import lower
from .core import supported_ops
from .jvp import lower_jvp
from .registry import BACKWARD, rule

__all__ = ["lower", "lower_jvp", "supported_ops", "BACKWARD", "rule"]

