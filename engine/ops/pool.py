"""Pooling: MaxPool, AveragePool, LpPool and their global forms, over any number of spatial dims;
and MaxUnpool, which scatters pooled values back to where MaxPool found them."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import OnnxGradError
from ..padding import resolve_pads
from ..registry import describe, register
from .conv import spatial_params, torch_pad_list


def _geometry(op, x, auto_pad, ceil_mode, kernel, strides, dilations, pads):
    """Output sizes, ONNX pads (begin, end) and the extra end padding ceil_mode needs."""
    kernel, strides, dilations, pads = spatial_params(op, x, kernel, strides, dilations, pads)
    in_sizes = list(x.shape[2:])
    begin, end = resolve_pads(op, auto_pad, in_sizes, kernel, strides, dilations, pads)
    outs, extra = [], []
    for n, k, s, d, b, e in zip(in_sizes, kernel, strides, dilations, begin, end):
        ek = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # NOTE: SAME pads with the dilated kernel, as the spec says; onnxruntime pads with the
            # undilated kernel and so returns fewer outputs when dilations > 1.
            out = -(-n // s)
        elif ceil_mode and auto_pad != "VALID":  # VALID's ceil formula equals its floor formula
            out = -(-(n + b + e - ek) // s) + 1
            # NOTE: ceil_mode drops a last window that would start inside the end padding (as torch does).
            if (out - 1) * s >= n + b:
                out -= 1
        else:
            out = (n + b + e - ek) // s + 1
        outs.append(out)
        extra.append(max(0, (out - 1) * s + ek - (n + b + e)))
    return kernel, strides, dilations, begin, end, outs, extra


def _windows(t, first_dim, kernel, strides, dilations):
    """Sliding windows over dims first_dim.. -> (..., out_1..out_n, prod(kernel))."""
    nd = len(kernel)
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        t = t.unfold(first_dim + i, (k - 1) * d + 1, s)[..., ::d]
    return t.flatten(t.dim() - nd)


def _padded(x, begin, end, extra, value):
    x = F.pad(x, torch_pad_list(begin, end), value=value)
    if any(extra):
        x = F.pad(x, torch_pad_list([0] * len(extra), extra), value=value)
    return x


def _lowest(dtype):
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


_TORCH_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _torch_max_pool(x, kernel, strides, dilations, begin, outs, ceil_mode):
    """torch's own pooling kernel (much faster forward and backward than windows + max), used
    when its padding rules can express the geometry; None otherwise."""
    pool = _TORCH_MAX_POOL.get(x.dim() - 2)
    if pool is None or not x.is_floating_point() or any(2 * b > k for b, k in zip(begin, kernel)):
        return None
    try:
        y = pool(x, kernel, strides, begin, dilations, ceil_mode=bool(ceil_mode))
    except RuntimeError:  # a geometry torch refuses (e.g. an empty output)
        return None
    return y if list(y.shape[2:]) == outs else None


@describe("MaxPool", needs="in0,out1", rule="dX = dY scattered to the arg-max of each window (ties: the first)")
@register("MaxPool", since=1)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None, n_outputs=1):
    kernel, strides, dilations, begin, end, outs, extra = _geometry(
        "MaxPool", x, auto_pad, ceil_mode, kernel_shape, strides, dilations, pads)
    if n_outputs < 2 and begin == end:
        y = _torch_max_pool(x, kernel, strides, dilations, begin, outs, ceil_mode)
        if y is not None:
            return y
    win = _windows(_padded(x, begin, end, extra, _lowest(x.dtype)), 2, kernel, strides, dilations)
    # NOTE: on ties the first element in the window wins, for the value's gradient and for Indices.
    y, arg = win.max(dim=-1)
    if n_outputs < 2:
        return y
    spatial = list(x.shape[2:])
    size = math.prod(spatial)
    flat = torch.arange(size, device=x.device)
    if storage_order == 1:  # column-major indices
        flat = flat.reshape(spatial[::-1]).permute(*reversed(range(len(spatial))))
    else:
        flat = flat.reshape(spatial)
    flat = _padded(flat[None, None], begin, end, extra, -1)
    iwin = _windows(flat, 2, kernel, strides, dilations).expand(*x.shape[:2], *win.shape[2:])
    idx = torch.gather(iwin, -1, arg.unsqueeze(-1)).squeeze(-1)
    base = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[0], x.shape[1])
    idx = idx + (base * size).reshape(*base.shape, *([1] * len(spatial)))
    return y, idx


@describe("AveragePool", needs="", rule="dX = dY spread evenly over each window ({kernel_shape})")
@register("AveragePool", since=1)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    kernel, strides, dilations, begin, end, _, extra = _geometry(
        "AveragePool", x, auto_pad, ceil_mode, kernel_shape, strides, dilations, pads)
    total = _windows(_padded(x, begin, end, extra, 0), 2, kernel, strides, dilations).sum(-1)
    # The divisor counts input cells, plus the explicit pads when count_include_pad, never the
    # extra cells ceil_mode adds past the end pad.
    ones = torch.ones(x.shape[2:], dtype=x.dtype, device=x.device)
    count = F.pad(ones[None, None], torch_pad_list(begin, end), value=float(bool(count_include_pad)))
    count = _padded(count, [0] * len(extra), [0] * len(extra), extra, 0)
    count = _windows(count, 2, kernel, strides, dilations).sum(-1)
    return total / count[0, 0]


@describe("LpPool", needs="in0,out0", rule="dX = sign(X) · |X|^(p − 1) · the window-sum adjoint of dY · Y^(1 − p)   # p = {p}")
@register("LpPool", since=1)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None,
            strides=None):
    kernel, strides, dilations, begin, end, _, extra = _geometry(
        "LpPool", x, auto_pad, ceil_mode, kernel_shape, strides, dilations, pads)
    win = _windows(_padded(x, begin, end, extra, 0), 2, kernel, strides, dilations)
    # NOTE: the p-th root has an infinite derivative where a whole window is zero.
    return win.abs().pow(p).sum(-1).pow(1.0 / p)


@describe("GlobalAveragePool", needs="", rule="dX = broadcast(dY / (H·W), shape(X))")
@register("GlobalAveragePool", since=1)
def global_average_pool(x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@describe("GlobalMaxPool", needs="in0,out0", rule="dX = dY at each channel's arg-max, 0 elsewhere")
@register("GlobalMaxPool", since=1)
def global_max_pool(x):
    # NOTE: amax splits the gradient evenly between tied maxima.
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@describe("GlobalLpPool", needs="in0,out0", rule="dX = dY · sign(X) · (|X| / Y)^(p − 1)   # p = {p}")
@register("GlobalLpPool", since=1)
def global_lp_pool(x, *, p=2):
    return x.abs().pow(p).sum(dim=tuple(range(2, x.dim())), keepdim=True).pow(1.0 / p)


@describe("MaxUnpool", needs="in1", rule=("dX = dY gathered at the positions I names", None, None))
@register("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    nd = x.dim() - 2
    kernel = list(kernel_shape or [])
    if len(kernel) != nd:
        raise OnnxGradError(f"MaxUnpool: kernel_shape {kernel} does not match {nd} spatial dims")
    strides = list(strides) if strides else [1] * nd
    pads = list(pads) if pads else [0] * (2 * nd)
    inferred = list(x.shape[:2]) + [(n - 1) * s - (pads[i] + pads[nd + i]) + k
                                    for i, (n, s, k) in enumerate(zip(x.shape[2:], strides, kernel))]
    # Indices are flat positions in the unpadded, inferred output (as MaxPool's Indices are).
    y = torch.zeros(math.prod(inferred), dtype=x.dtype, device=x.device)
    y = y.scatter(0, indices.reshape(-1).to(torch.int64), x.reshape(-1)).reshape(inferred)
    if output_shape is None:
        return y
    want = [int(v) for v in output_shape.reshape(-1).tolist()]
    if len(want) != x.dim() or any(w < i for w, i in zip(want, inferred)):
        raise OnnxGradError(f"MaxUnpool: output_shape {want} is smaller than the shape {inferred} that kernel_shape "
                            f"{kernel}, strides {strides} and pads {pads} infer")
    return F.pad(y, torch_pad_list([0] * x.dim(), [w - i for w, i in zip(want, inferred)]))
