"""Sampling at computed positions: GridSample, AffineGrid (a spatial transformer's two halves) and
Col2Im (the adjoint of im2col, torch's F.fold)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import computes_in_float32
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .conv import torch_pad_list
from .shape import int_list

_MODES_16 = {"bilinear": "bilinear", "nearest": "nearest", "bicubic": "bicubic"}
_MODES_20 = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}
_PADDING = ("zeros", "border", "reflection")


def _grid_sample(x, grid, mode, padding_mode, align_corners, op):
    if padding_mode not in _PADDING:
        raise UnsupportedOpError(f"{op}: padding_mode {padding_mode!r} is not supported (use {', '.join(_PADDING)})")
    nd = x.dim() - 2
    if grid.dim() != x.dim() or grid.shape[-1] != nd:
        raise OnnxGradError(f"{op}: grid {list(grid.shape)} does not match input {list(x.shape)} "
                            f"(need (N, *out, {nd}))")
    if mode == "bicubic" and nd == 3:
        raise UnsupportedOpError(f"{op}: cubic mode on 3-D (volumetric) input is not supported (2-D is)")
    if nd not in (1, 2, 3):
        raise UnsupportedOpError(f"{op}: {nd}-D input is not supported (1-D, 2-D and 3-D are)")
    grid = grid.to(x.dtype)
    if nd == 1:
        # A height-1 image sampled at normalized row 0 lands exactly on its row, whatever align_corners says.
        y = F.grid_sample(x.unsqueeze(2), torch.stack([grid[..., 0], torch.zeros_like(grid[..., 0])], -1).unsqueeze(1),
                          mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners))
        return y.squeeze(2)
    return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners))


@register("GridSample", since=16, until=19)
@computes_in_float32  # NOTE: sample positions in half lose their fraction (ulp 0.25 at pixel 300)
def grid_sample_16(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    if mode not in _MODES_16:
        raise UnsupportedOpError(f"GridSample: mode {mode!r} is not supported (use bilinear, nearest or bicubic)")
    return _grid_sample(x, grid, _MODES_16[mode], padding_mode, align_corners, "GridSample")


@describe("GridSample", needs="in",
          rule=("dX = dY sent back along each output's sampling weights ({mode})",
                "dgrid = dY · ∂(X sampled at grid)/∂(position)   # 0 for nearest"))
@register("GridSample", since=20)
@computes_in_float32
def grid_sample(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    if mode not in _MODES_20:
        raise UnsupportedOpError(f"GridSample: mode {mode!r} is not supported (use linear, nearest or cubic)")
    return _grid_sample(x, grid, _MODES_20[mode], padding_mode, align_corners, "GridSample")


def _base_coords(n, align_corners, like):
    """Normalized pixel-centre positions along one axis in [-1, 1]."""
    if n <= 1:
        return torch.zeros(n, dtype=like.dtype, device=like.device)
    steps = torch.arange(n, dtype=like.dtype, device=like.device)
    if align_corners:
        return steps * (2.0 / (n - 1)) - 1.0
    return (2.0 * steps + 1.0) / n - 1.0


@describe("AffineGrid", needs="", rule="dtheta = Σ over the grid of dY ⊗ the base coordinates")
@register("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners=0):
    sizes = int_list(size)
    spatial = sizes[2:]
    nd = len(spatial)
    if nd not in (2, 3) or list(theta.shape[-2:]) != [nd, nd + 1]:
        raise OnnxGradError(f"AffineGrid: size {sizes} needs theta of shape (N, {nd}, {nd + 1}), "
                            f"got {list(theta.shape)}")
    # Homogeneous coordinates are ordered (x, y[, z], 1): x runs along the last spatial axis.
    axes = [_base_coords(n, align_corners, theta) for n in reversed(spatial)]
    mesh = torch.meshgrid(*reversed(axes), indexing="ij")  # each of shape `spatial`
    base = torch.stack([*reversed(mesh), torch.ones(spatial, dtype=theta.dtype, device=theta.device)], -1)
    grid = torch.matmul(base.reshape(-1, nd + 1), theta.transpose(-1, -2))
    return grid.reshape(theta.shape[0], *spatial, nd)


_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@describe("Col2Im", needs="", rule=("dinput = Im2Col(dY)   # each column gathers its patch back", None, None))
@register("Col2Im", since=18)
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    image, block = int_list(image_shape), int_list(block_shape)
    nd = len(image)
    if nd not in _CONV_T or len(block) != nd:
        raise UnsupportedOpError(f"Col2Im: {nd}-D images are not supported (1-D to 3-D are)")
    dilations = list(dilations) if dilations else [1] * nd
    strides = list(strides) if strides else [1] * nd
    pads = list(pads) if pads else [0] * (2 * nd)
    begin, end = pads[:nd], pads[nd:]
    k = 1
    for b in block:
        k *= b
    n, ck, length = x.shape
    blocks = [(i + b + e - (kk - 1) * d - 1) // s + 1
              for i, kk, d, s, b, e in zip(image, block, dilations, strides, begin, end)]
    count = 1
    for b in blocks:
        count *= b
    if ck % k or count != length or min(blocks) < 1:
        raise OnnxGradError(f"Col2Im: input {list(x.shape)} does not fit image {image}, block {block} with strides "
                            f"{strides}, pads {pads}, dilations {dilations} (expected C*{k} rows and {count} columns)")
    c = ck // k
    # Summing every column back onto its block is a transposed convolution whose kernel is one-hot.
    eye = torch.eye(k, dtype=x.dtype, device=x.device).reshape(k, 1, *block)
    weight = eye.repeat(c, *([1] * (nd + 1)))
    y = _CONV_T[nd](x.reshape(n, ck, *blocks), weight, stride=strides, dilation=dilations, groups=c)
    full = [i + b + e for i, b, e in zip(image, begin, end)]
    tail = [f - s for f, s in zip(full, y.shape[2:])]  # positions no block reaches
    return F.pad(y, torch_pad_list([-b for b in begin], [t - e for t, e in zip(tail, end)]))


@describe("DeformConv", needs="in",
          rule=("dX = dY sent back through each bilinear sample of the deformed kernel",
                "dW = correlate(sampled X, dY)",
                "doffset = dY · W · ∂(bilinear sample)/∂(position)",
                "dB = Σ dY over N and the spatial axes",
                "dmask = dY · W · sampled X"))
@register("DeformConv", since=19)
@computes_in_float32  # NOTE: as GridSample: the offsets are sample positions
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None, offset_group=1,
                pads=None, strides=None):
    if x.dim() != 4:
        raise UnsupportedOpError(f"DeformConv: only 2-D images are supported, got input {list(x.shape)}")
    n, c, h, wd = x.shape
    kh, kw = kernel_shape or w.shape[2:]
    sh, sw = strides or (1, 1)
    dh, dw = dilations or (1, 1)
    top, left = (pads or (0, 0, 0, 0))[:2]
    oh, ow = offset.shape[2:]
    k = kh * kw
    if offset.shape[1] != 2 * offset_group * k or c % offset_group or c != w.shape[1] * group:
        raise OnnxGradError(f"DeformConv: offset {list(offset.shape)}, weight {list(w.shape)} and input "
                            f"{list(x.shape)} disagree for group={group}, offset_group={offset_group}")
    # Sampling positions (pixel units) of every kernel tap at every output position.
    rows = (torch.arange(oh, dtype=x.dtype, device=x.device) * sh - top).reshape(1, 1, 1, oh, 1)
    cols = (torch.arange(ow, dtype=x.dtype, device=x.device) * sw - left).reshape(1, 1, 1, 1, ow)
    tap_r = (torch.arange(kh, dtype=x.dtype, device=x.device) * dh).repeat_interleave(kw).reshape(1, 1, k, 1, 1)
    tap_c = (torch.arange(kw, dtype=x.dtype, device=x.device) * dw).repeat(kh).reshape(1, 1, k, 1, 1)
    off = offset.reshape(n, offset_group, k, 2, oh, ow)
    pr, pc = rows + tap_r + off[:, :, :, 0], cols + tap_c + off[:, :, :, 1]  # (N, G, k, oh, ow)
    # One zero row and column past the end make every size >= 2, so align_corners maps pixel p to
    # exactly p, and sampling just past the border meets the zeros that bilinear padding would.
    img = F.pad(x, (0, 1, 0, 1)).reshape(n * offset_group, c // offset_group, h + 1, wd + 1)
    grid = torch.stack([pc / wd * 2 - 1, pr / h * 2 - 1], -1).reshape(n * offset_group, k, oh * ow, 2)
    cols_ = F.grid_sample(img, grid.to(x.dtype), mode="bilinear", padding_mode="zeros", align_corners=True)
    cols_ = cols_.reshape(n, offset_group, c // offset_group, k, oh * ow)
    if mask is not None:
        cols_ = cols_ * mask.reshape(n, offset_group, 1, k, oh * ow)
    cols_ = cols_.reshape(n, group, (c // group) * k, oh * ow)
    out = torch.einsum("ngkl,gok->ngol", cols_, w.reshape(group, w.shape[0] // group, -1))
    out = out.reshape(n, w.shape[0], oh, ow)
    return out if b is None else out + b.reshape(1, -1, 1, 1)
