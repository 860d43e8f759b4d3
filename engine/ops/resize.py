"""Resize and the deprecated Upsample.

Resizing is separable: each resized axis becomes one constant (out, in) interpolation matrix
(or one index vector for nearest) built from shapes and scales alone, so the data path is a
matmul / index_select that torch.autograd differentiates exactly.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register

MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _source_coords(ctm, out_int, in_w, scale, roi):
    """Source coordinate of every output index along one axis, and the extrapolated mask."""
    y = np.arange(out_int, dtype=np.float64)
    # NOTE: out_w is the fractional scale * length, as in ONNX's reference and node tests; with
    # scales that miss an integer length, align_corners and tf_crop_and_resize then differ from
    # onnxruntime, which divides by the integer output length.
    out_w = scale * in_w
    if ctm == "align_corners":
        x = np.zeros(out_int) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_int, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "tf_half_pixel_for_nn":  # opset 11-12 only
        x = (y + 0.5) / scale
    elif ctm == "half_pixel_symmetric":
        offset = in_w / 2 * (1 - out_int / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    else:  # tf_crop_and_resize
        lo, hi = roi
        if out_w == 1:
            x = np.full(out_int, (hi - lo) * (in_w - 1) / 2)
        else:
            x = y * (hi - lo) * (in_w - 1) / (out_w - 1)
        x = x + lo * (in_w - 1)
        return x, (x < 0) | (x > in_w - 1)
    return x, None


def _nearest_index(x, in_w, nearest_mode, scale):
    base = np.floor(x)
    frac = x - base
    if nearest_mode == "round_prefer_floor":
        up = frac > 0.5
    elif nearest_mode == "round_prefer_ceil":
        up = frac >= 0.5
    elif nearest_mode == "floor":
        up = np.zeros_like(frac, dtype=bool)
    elif nearest_mode == "ceil":
        up = frac > 0
    else:  # "simple": Upsample and Resize-10 floor when enlarging and ceil when shrinking
        up = (frac > 0) if scale < 1 else np.zeros_like(frac, dtype=bool)
    return np.clip(base + up, 0, in_w - 1).astype(np.int64)


def _coeffs(mode, ratio, scale, antialias, a):
    """Interpolation weights (out, n) for the n taps around each source coordinate."""
    r = ratio[:, None]
    if mode == "linear" and not antialias:
        return np.concatenate([1 - r, r], axis=1)
    if mode == "cubic" and not antialias:
        r1, q, q1 = r + 1, 1 - r, 2 - r
        return np.concatenate([
            ((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * q - (a + 3)) * q * q + 1,
            ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a,
        ], axis=1)
    # Antialias widens the kernel by 1/scale when shrinking.
    s = min(scale, 1.0)
    if mode == "linear":
        start = math.floor(-1 / s) + 1
        taps = np.arange(start, 2 - start, dtype=np.float64)
        w = np.clip(1 - np.abs((taps[None, :] - r) * s), 0, 1)
    else:
        start = math.floor(-2 / s) + 1
        taps = np.arange(start, 2 - start, dtype=np.float64)
        t = np.abs(s * (taps[None, :] - r))
        w = np.where(t <= 1, (a + 2) * t**3 - (a + 3) * t**2 + 1,
                     np.where(t < 2, a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a, 0.0))
    return w / w.sum(axis=1, keepdims=True)


def _interp_matrix(x, in_w, mode, scale, antialias, cubic_a, exclude_outside):
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)  # in (0, 1]: prefer the left neighbour
    w = _coeffs(mode, ratio, scale, antialias, cubic_a)
    n = w.shape[1]
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_w), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    mat = np.zeros((len(x), in_w))
    np.add.at(mat, (np.repeat(np.arange(len(x)), n), np.clip(idx, 0, in_w - 1).ravel()), w.ravel())
    return mat


def _resize_axis(x, axis, out_int, scale, roi, *, mode, ctm, nearest_mode, cubic_a, exclude_outside,
                 antialias, extrapolation_value):
    in_w = x.shape[axis]
    src, outside = _source_coords(ctm, out_int, in_w, scale, roi)
    if mode == "nearest":
        idx = torch.from_numpy(_nearest_index(src, in_w, nearest_mode, scale)).to(x.device)
        y = x.index_select(axis, idx)
    else:
        mat = _interp_matrix(src, in_w, mode, scale, antialias, cubic_a, exclude_outside)
        y = (x.movedim(axis, -1) @ torch.from_numpy(mat).to(x.dtype).to(x.device).T).movedim(-1, axis)
    if outside is not None and outside.any():
        mask = torch.from_numpy(outside).to(x.device).reshape([-1] + [1] * (x.dim() - axis - 1))
        y = torch.where(mask, torch.full((), extrapolation_value, dtype=y.dtype, device=y.device), y)
    return y


def _resize(x, scales, sizes, roi, axes, *, mode, ctm, nearest_mode, cubic_a=-0.75, exclude_outside=0,
            extrapolation_value=0.0, antialias=0, keep_aspect_ratio_policy="stretch"):
    for name, value, allowed in (("mode", mode, MODES), ("coordinate_transformation_mode", ctm, COORD_MODES),
                                 ("keep_aspect_ratio_policy", keep_aspect_ratio_policy, ASPECT_POLICIES)):
        if value not in allowed:
            raise UnsupportedOpError(f"Resize: {name}={value!r} is not supported (use one of {', '.join(allowed)})")
    rank = x.dim()
    axes = list(range(rank)) if not axes else [a % rank for a in axes]
    in_sizes = [x.shape[a] for a in axes]
    if sizes is not None:
        if len(sizes) != len(axes):
            raise OnnxGradError(f"Resize: sizes {sizes} do not match {len(axes)} resized axes")
        factors = [o / i for o, i in zip(sizes, in_sizes)]
        if keep_aspect_ratio_policy != "stretch":
            s = min(factors) if keep_aspect_ratio_policy == "not_larger" else max(factors)
            factors = [s] * len(axes)
            sizes = [int(s * i + 0.5) for i in in_sizes]
        outs = list(sizes)
    elif scales is not None:
        if len(scales) != len(axes):
            raise OnnxGradError(f"Resize: scales {scales} do not match {len(axes)} resized axes")
        factors = list(scales)
        # NOTE: scales are float32, and onnxruntime takes floor(scale * length) in float32 too:
        # 5/3 on 3 gives 5 there (and in torch, whose exporter wrote that scale), 4 in float64.
        outs = [int(np.float32(s) * np.float32(i)) for s, i in zip(scales, in_sizes)]
    else:
        raise OnnxGradError("Resize: one of scales or sizes must be given")
    if roi is not None and len(roi) not in (0, 2 * len(axes), 2 * rank):
        raise OnnxGradError(f"Resize: roi has {len(roi)} values, expected {2 * len(axes)}")
    dtype = x.dtype
    y = x if dtype.is_floating_point or mode == "nearest" else x.to(torch.float64)
    for k, a in enumerate(axes):
        pair = (0.0, 1.0)
        if roi and len(roi) == 2 * len(axes):
            pair = (roi[k], roi[len(axes) + k])
        elif roi and len(roi) == 2 * rank:
            pair = (roi[a], roi[rank + a])
        if ctm == "tf_crop_and_resize" and not roi:
            raise OnnxGradError("Resize: coordinate_transformation_mode tf_crop_and_resize needs roi")
        if factors[k] == 1.0 and outs[k] == in_sizes[k] and pair == (0.0, 1.0):
            continue
        y = _resize_axis(y, a, outs[k], factors[k], pair, mode=mode, ctm=ctm, nearest_mode=nearest_mode,
                         cubic_a=cubic_a, exclude_outside=exclude_outside, antialias=antialias,
                         extrapolation_value=extrapolation_value)
    if y.dtype != dtype:
        info = torch.iinfo(dtype) if not dtype.is_floating_point and dtype != torch.bool else None
        y = (y.round().clamp(info.min, info.max) if info else y).to(dtype)
    return y


def _values(t):
    return None if t is None or t.numel() == 0 else t.reshape(-1).tolist()


@describe("Resize", needs="", rule=("dX = dY spread back with the interpolation's own weights   # mode {mode}", None, None, None))
@register("Resize", since=11)
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    if nearest_mode not in NEAREST_MODES:
        raise UnsupportedOpError(f"Resize: nearest_mode={nearest_mode!r} is not supported "
                                 f"(use one of {', '.join(NEAREST_MODES)})")
    sizes = _values(sizes)
    return _resize(x, None if sizes is not None else _values(scales), sizes, _values(roi), axes,
                   mode=mode, ctm=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, antialias=antialias,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy)


def _legacy(x, scales, mode, op):
    # NOTE: before opset 11 coordinates are asymmetric and nearest truncates (ceil when shrinking).
    mode = {"bilinear": "linear"}.get(mode.lower(), mode.lower())
    if mode not in ("nearest", "linear"):
        raise UnsupportedOpError(f"{op}: mode={mode!r} is not supported (use nearest or linear)")
    return _resize(x, scales, None, None, None, mode=mode, ctm="asymmetric", nearest_mode="simple")


@register("Resize", since=10, until=10)
def resize_10(x, scales, *, mode="nearest"):
    return _legacy(x, _values(scales), mode, "Resize")


@describe("Upsample", needs="", rule="dX = dY spread back with the interpolation's own weights   # mode {mode}")
@register("Upsample", since=9)
def upsample_9(x, scales, *, mode="nearest"):
    return _legacy(x, _values(scales), mode, "Upsample")


@register("Upsample", since=7, until=8)
def upsample_7(x, *, mode="nearest", scales):
    return _legacy(x, list(scales), mode, "Upsample")


@register("Upsample", since=1, until=6)
def upsample_1(x, *, mode="nearest", height_scale, width_scale):
    return _legacy(x, [1.0] * (x.dim() - 2) + [height_scale, width_scale], mode, "Upsample")
