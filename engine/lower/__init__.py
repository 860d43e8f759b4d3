"""Lower Gradient to standard ONNX: the backward graph as plain ai.onnx ops any runtime can execute.

    lower(model, y=None, xs=None, zs=None, dy=None, names=None) -> onnx.ModelProto
    supported_ops() -> the op types that have a backward rule

The rules live one module per op family, mirroring engine/ops; importing them fills BACKWARD.
The package itself is callable, so `engine.lower(model, ...)` is `engine.lower.lower(model, ...)`.
"""
import sys
import types

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
    shape,
    signal,
)
from .core import supported_ops
from .lowering import lower
from .registry import BACKWARD, rule

__all__ = ["lower", "supported_ops", "BACKWARD", "rule"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return lower(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
