"""Ops that make tensors from attributes or shapes: Constant, ConstantOfShape, Range, EyeLike."""
from __future__ import annotations

import torch

from ..dtypes import onnx_to_torch
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .shape import int_list

_CONSTANT_ATTRS = ("value", "sparse_value", "value_float", "value_floats", "value_int", "value_ints",
                   "value_string", "value_strings")


@describe("Constant", no_gradient="no inputs")
@register("Constant", since=1)
def constant(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None, device, float_dtype=None):
    given = {k: v for k, v in zip(_CONSTANT_ATTRS, (value, sparse_value, value_float, value_floats,
                                                     value_int, value_ints, value_string, value_strings))
             if v is not None}
    if len(given) != 1:
        raise OnnxGradError(f"Constant needs exactly one value attribute, got {sorted(given) or 'none'}")
    (name, v), = given.items()
    if name in ("value_string", "value_strings"):
        raise UnsupportedOpError(f"Constant {name}: string tensors are not supported")
    if name == "sparse_value":
        raise UnsupportedOpError("Constant sparse_value: sparse tensors are not supported")
    if name == "value":
        return v
    dtype = (float_dtype or torch.float32) if name.startswith("value_float") else torch.int64
    return torch.tensor(v, dtype=dtype, device=device)


@describe("ConstantOfShape", no_gradient="the result depends only on the given shape")
@register("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None, float_dtype=None):
    if value is None:
        fill = torch.zeros((), dtype=float_dtype or torch.float32, device=shape.device)
    else:
        fill = value.reshape(())
    return fill.expand(int_list(shape)).clone()


def _range(start, limit, delta, low_precision_dtype):
    if not start.is_floating_point():
        lo, hi, step = (int(t.reshape(())) for t in (start, limit, delta))
        if step == 0:
            raise OnnxGradError("Range: delta must not be 0")
        return torch.arange(lo, hi, step, dtype=start.dtype, device=start.device)
    count = torch.ceil((limit.double() - start.double()) / delta.double()).clamp(min=0)
    if not torch.isfinite(count):
        raise OnnxGradError("Range: the element count is not finite (delta 0 or non-finite bounds)")
    n = int(count)
    compute = low_precision_dtype if start.dtype in (torch.float16, torch.bfloat16) else torch.float64
    steps = torch.arange(n, dtype=compute, device=start.device)
    # start + i * delta (not a running sum), so start and delta keep their gradients
    out = start.reshape(()).to(compute) + steps * delta.reshape(()).to(compute)
    return out.to(start.dtype)


@register("Range", since=11, until=26)
def range_11(start, limit, delta):
    return _range(start, limit, delta, torch.float64)


@describe("Range", needs="", rule=("dstart = Σ dY", None, "ddelta = Σᵢ i · dYᵢ   # the limit only sets the length"))
@register("Range", since=27)
def range_27(start, limit, delta, *, stash_type=1):
    if stash_type not in (1, 11):
        raise UnsupportedOpError(f"Range stash_type {stash_type} is not supported (1=float, 11=double are)")
    return _range(start, limit, delta, torch.float32 if stash_type == 1 else torch.float64)


@describe("EyeLike", no_gradient="the result depends only on the input's shape")
@register("EyeLike", since=9)
def eye_like(x, *, dtype=None, k=0):
    if x.dim() != 2:
        raise OnnxGradError(f"EyeLike needs a 2-D input, got shape {list(x.shape)}")
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    cols = torch.arange(x.shape[1], device=x.device)[None, :]
    return (cols - rows == k).to(x.dtype if dtype is None else onnx_to_torch(dtype))
