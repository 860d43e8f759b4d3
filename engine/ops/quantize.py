"""Integer quantization (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, ConvInteger) and BitCast.

The engine holds uint16 as int32 and uint32 as int64 (see engine/dtypes.py). No ONNX quantized type
is int32, so an int32 zero point here can only be a widened uint16, and its range is 0..65535.
"""
from __future__ import annotations

import torch
from onnx import TensorProto

from ..dtypes import onnx_to_torch
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .conv import conv

_RANGES = {  # torch dtype the engine holds -> (low, high)
    torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767), torch.int32: (0, 65535),
}
_ONNX_QUANT = {TensorProto.UINT8: torch.uint8, TensorProto.INT8: torch.int8, TensorProto.INT16: torch.int16,
               TensorProto.UINT16: torch.int32}


def _along(value, x, axis, block_size):
    """A scale or zero point broadcastable to x: scalar, per-axis (1-D) or blocked (x's rank)."""
    if value.dim() == 0 or value.numel() == 1:
        return value.reshape(())
    axis = axis % x.dim()
    if not block_size:
        if value.dim() != 1 or value.shape[0] != x.shape[axis]:
            blocked = " (a scale of x's rank is blocked: block_size is 0)" if value.dim() == x.dim() > 1 else ""
            raise OnnxGradError(f"per-axis scale of shape {list(value.shape)} does not match axis {axis} "
                                f"of input {list(x.shape)}{blocked}")
        shape = [1] * x.dim()
        shape[axis] = -1
        return value.reshape(shape)
    # checked before repeat_interleave, which would allocate block_size copies of each scale
    want = list(x.shape)
    want[axis] = -(-x.shape[axis] // block_size) if block_size > 0 else -1
    if value.dim() != x.dim() or block_size < 1 or value.shape[axis] < want[axis] or any(
            v != w for i, (v, w) in enumerate(zip(value.shape, want)) if i != axis):
        raise OnnxGradError(f"scale of shape {list(value.shape)} does not block input {list(x.shape)} along axis "
                            f"{axis} by block_size {block_size} (that takes a scale of shape {want})")
    return value.repeat_interleave(min(block_size, x.shape[axis]), axis).narrow(axis, 0, x.shape[axis])


def _quant_dtype(zero_point, output_dtype):
    if zero_point is not None:
        if zero_point.dtype not in _RANGES:
            raise UnsupportedOpError(f"QuantizeLinear: zero point type {zero_point.dtype} is not supported "
                                     "(8- and 16-bit integers are)")
        return zero_point.dtype
    if not output_dtype:
        return torch.uint8
    if output_dtype not in _ONNX_QUANT:
        name = TensorProto.DataType.Name(output_dtype) if output_dtype in TensorProto.DataType.values() else "?"
        raise UnsupportedOpError(f"QuantizeLinear: output_dtype = {output_dtype} ({name}) is not supported "
                                 "(8- and 16-bit integers are)")
    return _ONNX_QUANT[output_dtype]


def _saturate(values, dtype):
    low, high = _RANGES[dtype]
    return values.clamp(low, high).to(dtype)


def _quantize(x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0, precision=0):
    # NOTE: the output is an integer tensor, so nothing flows back through it.
    dtype = _quant_dtype(y_zero_point, output_dtype)
    work = onnx_to_torch(precision) if precision else y_scale.dtype  # the spec's default: y_scale's type
    q = torch.round(x.to(work) / _along(y_scale, x, axis, block_size).to(work))  # half to even, as rint
    # The zero point and the bounds in float32 at least: 32767 and 65535 are not float16 numbers.
    q = q.to(torch.promote_types(work, torch.float32))
    if y_zero_point is not None:
        q = q + _along(y_zero_point, x, axis, block_size).to(q.dtype)
    return _saturate(q, dtype)


@register("QuantizeLinear", since=10, until=12)
def quantize_linear_10(x, y_scale, y_zero_point=None):
    return _quantize(x, y_scale, y_zero_point)


@register("QuantizeLinear", since=13, until=20)
def quantize_linear_13(x, y_scale, y_zero_point=None, *, axis=1, saturate=1):
    return _quantize(x, y_scale, y_zero_point, axis)


@describe("QuantizeLinear", no_gradient="an integer result")
@register("QuantizeLinear", since=21)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0,
                    saturate=1):
    return _quantize(x, y_scale, y_zero_point, axis, block_size, output_dtype, precision)


def _dequantize(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
    if x.is_floating_point():
        raise UnsupportedOpError(f"DequantizeLinear: input type {x.dtype} is not supported (integers are)")
    work = torch.promote_types(x_scale.dtype, torch.float32)
    dx = x.to(work)
    if x_zero_point is not None:
        dx = dx - _along(x_zero_point, x, axis, block_size).to(work)
    y = dx * _along(x_scale, x, axis, block_size).to(work)
    return y.to(onnx_to_torch(output_dtype) if output_dtype else x_scale.dtype)


@register("DequantizeLinear", since=10, until=12)
def dequantize_linear_10(x, x_scale, x_zero_point=None):
    return _dequantize(x, x_scale, x_zero_point)


@register("DequantizeLinear", since=13, until=20)
def dequantize_linear_13(x, x_scale, x_zero_point=None, *, axis=1):
    return _dequantize(x, x_scale, x_zero_point, axis)


@describe("DequantizeLinear", needs="in0,in2",
          rule=(None,
                "dx_scale = Σ over each scale's elements of dY · (x − x_zero_point)",
                None))
@register("DequantizeLinear", since=21)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    return _dequantize(x, x_scale, x_zero_point, axis, block_size, output_dtype)


@describe("DynamicQuantizeLinear", needs="", rule="dx = 0                     # y is rounded, y_scale taken as a constant of x")
@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x, *, n_outputs=3):
    xf = x.detach().to(torch.float32)
    high = torch.clamp(xf.max(), min=0.0)
    low = torch.clamp(xf.min(), max=0.0)
    scale = torch.where(high == low, torch.ones_like(high), high - low) / 255.0
    zero_point = torch.round(torch.clamp(-low / scale, 0.0, 255.0))
    y = _saturate(torch.round(xf / scale) + zero_point, torch.uint8)
    return (y, scale.to(x.dtype), zero_point.to(torch.uint8))[:n_outputs]


def _centered(t, zero_point, shape_for_vector=None):
    t = t.to(torch.float64)  # exact for the integer sums these ops make
    if zero_point is None:
        return t
    zp = zero_point.to(torch.float64)
    if shape_for_vector is not None and zp.dim() == 1 and zp.numel() > 1:
        zp = zp.reshape(shape_for_vector)
    return t - zp


def _requantize(acc, scale, y_scale, y_zero_point, fallback):
    dtype = y_zero_point.dtype if y_zero_point is not None else fallback
    r = acc * (scale / y_scale.to(torch.float64))
    if y_zero_point is not None:
        r = r + y_zero_point.to(torch.float64)
    return _saturate(torch.round(r), dtype)


@describe("QLinearMatMul", no_gradient="an integer result")
@register("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    acc = torch.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point))
    # The scales multiply in their own precision (float16 cases round there), then requantize.
    scale = (a_scale * b_scale).to(torch.float64)
    return _requantize(acc, scale, y_scale, y_zero_point, a.dtype)


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@describe("ConvInteger", no_gradient="an integer result")
@register("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    wshape = [-1] + [1] * (w.dim() - 1)
    acc = conv(_centered(x, x_zero_point), _centered(w, w_zero_point, wshape), auto_pad=auto_pad,
               dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    return torch.round(acc).to(torch.int32)


@describe("QLinearConv", no_gradient="an integer result")
@register("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None, b=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    wshape = [-1] + [1] * (w.dim() - 1)
    acc = conv(_centered(x, x_zero_point), _centered(w, w_zero_point, wshape),
               None if b is None else b.to(torch.float64), auto_pad=auto_pad, dilations=dilations, group=group,
               kernel_shape=kernel_shape, pads=pads, strides=strides)
    w_scale = w_scale.to(torch.float64)
    if w_scale.numel() > 1:
        w_scale = w_scale.reshape([1, -1] + [1] * (acc.dim() - 2))
    return _requantize(acc, x_scale.to(torch.float64) * w_scale, y_scale, y_zero_point, x.dtype)


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@describe("BitCast", no_gradient="a reinterpretation of the bits")
@register("BitCast", since=26)
def bitcast(x, *, to):
    if to == TensorProto.STRING:
        raise UnsupportedOpError("BitCast to string is not supported")
    target = onnx_to_torch(to)
    width = {TensorProto.UINT16: 2, TensorProto.UINT32: 4}.get(to, target.itemsize)
    if x.itemsize != width:
        # A valid model casts between equal widths, so a wider integer input is a widened unsigned one.
        if x.is_floating_point() or x.itemsize < width or x.dtype not in (torch.int32, torch.int64):
            raise OnnxGradError(f"BitCast needs equal bit widths: to = {to} ({TensorProto.DataType.Name(to).lower()}) "
                                f"has {8 * width}, the input ({str(x.dtype).replace('torch.', '')}) {8 * x.itemsize}")
        x = x.to(_SIGNED[width])  # wraps, keeping the low bits
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if to == TensorProto.BOOL:
        return x.view(torch.uint8) != 0
    if target.itemsize != width:  # widened unsigned target
        return x.view(_SIGNED[width]).to(target) & ((1 << (8 * width)) - 1)
    return x.view(target)
