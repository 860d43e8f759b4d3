"""Convolutions: Conv and ConvTranspose, plus the padding geometry the pooling ops share."""
from __future__ import annotations

import torch.nn.functional as F

from ..errors import OnnxGradError, UnsupportedOpError
from ..padding import AUTO_PADS, resolve_pads
from ..registry import describe, register


def spatial_params(op: str, x, kernel, strides, dilations, pads):
    """Fill ONNX defaults for kernel/strides/dilations/pads over x's spatial dims."""
    nd = x.dim() - 2
    if kernel is None or len(kernel) != nd:
        raise OnnxGradError(f"{op}: kernel_shape {kernel} does not match {nd} spatial dims of input {tuple(x.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    pads = list(pads) if pads else [0] * (2 * nd)
    if len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        raise OnnxGradError(f"{op}: strides/dilations/pads lengths do not match {nd} spatial dims")
    return list(kernel), strides, dilations, pads


def torch_pad_list(begin, end):
    """ONNX per-dim (begin, end) -> F.pad's last-dim-first flat list."""
    out = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _bias_shape(b, nd):
    return b.reshape([-1] + [1] * nd)


@describe("Conv", needs="in0,in1",
          rule=("dX = ConvTranspose(dY, W)   # strides {strides}, pads {pads}, group {group}",
                "dW = correlate(X, dY) summed over the batch",
                "dB = Σ dY over N and the spatial axes"))
@register("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    x, geometry = conv_geometry(x, w, auto_pad, dilations, group, kernel_shape, pads, strides)
    return convolve(x, w, b, geometry)


def convolve(x, w, b, geometry: dict):
    """F.conv1d/2d/3d by x's rank, with `conv_geometry`'s arguments."""
    return _CONV[x.dim() - 2](x, w, b, **geometry)


def conv_geometry(x, w, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """(x, padded where the pads are uneven; F.conv*d's stride, padding, dilation and groups) for
    a Conv node's attributes, checked against x and w."""
    nd = x.dim() - 2
    if nd not in _CONV:
        raise UnsupportedOpError(f"Conv: {nd}-D convolution is not supported (1-D, 2-D and 3-D are)")
    kernel = list(w.shape[2:])
    if kernel_shape and list(kernel_shape) != kernel:
        raise OnnxGradError(f"Conv: kernel_shape {list(kernel_shape)} disagrees with weight shape {tuple(w.shape)}")
    kernel, strides, dilations, pads = spatial_params("Conv", x, kernel, strides, dilations, pads)
    begin, end = resolve_pads("Conv", auto_pad, list(x.shape[2:]), kernel, strides, dilations, pads)
    if begin == end:
        padding = begin
    else:
        x = F.pad(x, torch_pad_list(begin, end))
        padding = [0] * nd
    return x, {"stride": strides, "padding": padding, "dilation": dilations, "groups": group}


@describe("ConvTranspose", needs="in0,in1",
          rule=("dX = Conv(dY, W)   # strides {strides}, group {group}",
                "dW = correlate(dY, X) summed over the batch",
                "dB = Σ dY over N and the spatial axes"))
@register("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    nd = x.dim() - 2
    if nd not in _CONV_T:
        raise UnsupportedOpError(f"ConvTranspose: {nd}-D is not supported (1-D, 2-D and 3-D are)")
    kernel, strides, dilations, pads = spatial_params(
        "ConvTranspose", x, list(w.shape[2:]), strides, dilations, pads)
    if auto_pad not in AUTO_PADS:
        raise UnsupportedOpError(f"ConvTranspose: auto_pad={auto_pad!r} is not supported")
    out_pad = list(output_padding) if output_padding else [0] * nd
    in_sizes = list(x.shape[2:])
    full = [s * (n - 1) + (k - 1) * d + 1 for n, k, s, d in zip(in_sizes, kernel, strides, dilations)]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # NOTE: per the spec an explicit output_shape overrides pads; SAME_* without it means in * stride.
        target = list(output_shape)[-nd:] if output_shape else [n * s for n, s in zip(in_sizes, strides)]
        begin, end = [], []
        for f, op, t in zip(full, out_pad, target):
            total = f + op - t
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID":
        begin, end = [0] * nd, [0] * nd
    else:
        begin, end = pads[:nd], pads[nd:]
    y = _CONV_T[nd](x, w, None, stride=strides, dilation=dilations, groups=group)
    # Crop the pads and append output_padding in one (possibly negative) F.pad.
    y = F.pad(y, torch_pad_list([-p for p in begin], [op - p for op, p in zip(out_pad, end)]))
    if b is not None:
        y = y + _bias_shape(b, nd)
    return y
