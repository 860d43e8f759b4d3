"""Object-detection heads: RoiAlign, MaxRoiPool and NonMaxSuppression."""
from __future__ import annotations

import math

import torch

from ..dtypes import computes_in_float32
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .shape import int_list


def _axis_samples(start, bin_size, pooled, grid, size):
    """Bilinear taps along one axis: (low, high) indices, their weights, and a validity mask,
    each of length pooled * grid, as ONNX's RoiAlign places them."""
    steps = torch.arange(pooled, dtype=start.dtype, device=start.device).repeat_interleave(grid)
    within = (torch.arange(grid, dtype=start.dtype, device=start.device) + 0.5).repeat(pooled)
    pos = start + steps * bin_size + within * bin_size / grid
    valid = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0)
    low = torch.floor(pos.detach()).to(torch.int64)
    at_end = low >= size - 1
    low = torch.where(at_end, torch.full_like(low, size - 1), low)
    high = torch.where(at_end, low, low + 1)
    pos = torch.where(at_end, low.to(pos.dtype), pos)
    frac = pos - low.to(pos.dtype)
    return low, high, 1.0 - frac, frac, valid


def _roi_align(x, rois, batch_indices, mode, out_h, out_w, sampling_ratio, spatial_scale, half_pixel):
    if mode not in ("avg", "max"):
        raise UnsupportedOpError(f"RoiAlign: mode {mode!r} is not supported (use avg or max)")
    if x.dim() != 4 or rois.dim() != 2 or rois.shape[1] != 4:
        raise OnnxGradError(f"RoiAlign needs X (N, C, H, W) and rois (R, 4), got {list(x.shape)}, {list(rois.shape)}")
    h, w = x.shape[2], x.shape[3]
    shift = 0.5 if half_pixel else 0.0
    boxes = rois * spatial_scale - shift
    outs = []
    for r, b in enumerate(int_list(batch_indices)):
        x0, y0, x1, y1 = boxes[r].unbind()
        rw, rh = x1 - x0, y1 - y0
        if not half_pixel:
            rw, rh = rw.clamp(min=1.0), rh.clamp(min=1.0)
        # NOTE: the adaptive sample count is an integer read from the ROI's size: the output is
        # piecewise smooth in the ROI coordinates, with jumps where the count changes.
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(float(rh.detach()) / out_h)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(float(rw.detach()) / out_w)
        ylo, yhi, wyl, wyh, vy = _axis_samples(y0, rh / out_h, out_h, gh, h)
        xlo, xhi, wxl, wxh, vx = _axis_samples(x0, rw / out_w, out_w, gw, w)
        fmap = x[b]
        ok = (vy[:, None] & vx[None, :]).to(x.dtype)
        corners = [fmap[:, yi][:, :, xi] * (wy[:, None] * wx[None, :]) * ok
                   for yi, wy in ((ylo, wyl), (yhi, wyh)) for xi, wx in ((xlo, wxl), (xhi, wxh))]
        c = fmap.shape[0]
        if mode == "avg":
            v = sum(corners).reshape(c, out_h, gh, out_w, gw)
            outs.append(v.sum((2, 4)) / max(gh * gw, 1))
        else:
            # NOTE: ONNX's max mode takes the largest weighted corner, not the interpolated value.
            v = torch.stack(corners, 0).amax(0).reshape(c, out_h, gh, out_w, gw)
            outs.append(v.amax(dim=(2, 4)))
    if not outs:
        return x.new_zeros((0, x.shape[1], out_h, out_w))
    return torch.stack(outs, 0)


@register("RoiAlign", since=10, until=15)
@computes_in_float32  # NOTE: in half, sample positions far from 0 lose their fraction (0.01 at x = 10)
def roi_align_10(x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=False)


@describe("RoiAlign", needs="in",
          rule=("dX = dY spread back over each bin's bilinear samples ({mode})",
                "drois = through the sample positions (bilinear weights in the box corners)",
                None))
@register("RoiAlign", since=16)
@computes_in_float32
def roi_align(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
              output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise UnsupportedOpError(f"RoiAlign: coordinate_transformation_mode {coordinate_transformation_mode!r} "
                                 "is not supported (use half_pixel or output_half_pixel)")
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=coordinate_transformation_mode == "half_pixel")


@describe("MaxRoiPool", needs="in", rule="dX = dY scattered to the arg-max of each pooled cell")
@register("MaxRoiPool", since=1)
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale=1.0):
    ph, pw = pooled_shape
    h, w = x.shape[2], x.shape[3]
    outs = []
    # ROI corners are rounded to pixels: the output is a max over fixed cells, with no gradient
    # to the ROI coordinates.
    # Corners scale in the ROIs' own precision and round half away from zero, as onnxruntime does.
    corners = rois.detach()[:, 1:] * spatial_scale
    corners = (torch.sign(corners) * torch.floor(corners.abs() + 0.5)).to(torch.int64).tolist()
    for b, (x0, y0, x1, y1) in zip(int_list(rois[:, 0].to(torch.int64)), corners):
        rh, rw = max(y1 - y0 + 1, 1), max(x1 - x0 + 1, 1)
        cells = []
        for i in range(ph):
            hs = min(max(math.floor(i * rh / ph) + y0, 0), h)
            he = min(max(math.ceil((i + 1) * rh / ph) + y0, 0), h)
            for j in range(pw):
                ws = min(max(math.floor(j * rw / pw) + x0, 0), w)
                we = min(max(math.ceil((j + 1) * rw / pw) + x0, 0), w)
                region = x[b, :, hs:he, ws:we]
                cells.append(region.amax((1, 2)) if he > hs and we > ws else x.new_zeros(x.shape[1]))
        outs.append(torch.stack(cells, -1).reshape(x.shape[1], ph, pw))
    return torch.stack(outs, 0) if outs else x.new_zeros((0, x.shape[1], ph, pw))


def _iou_suppresses(boxes, center_point_box, threshold):
    """(B, M, M) bool: box i suppresses box j (IoU above the threshold, both with positive area)."""
    if center_point_box:
        cx, cy, bw, bh = boxes.unbind(-1)
        x0, x1, y0, y1 = cx - bw / 2, cx + bw / 2, cy - bh / 2, cy + bh / 2
    else:
        ya, xa, yb, xb = boxes.unbind(-1)
        x0, x1 = torch.minimum(xa, xb), torch.maximum(xa, xb)
        y0, y1 = torch.minimum(ya, yb), torch.maximum(ya, yb)
    iw = torch.minimum(x1[:, :, None], x1[:, None, :]) - torch.maximum(x0[:, :, None], x0[:, None, :])
    ih = torch.minimum(y1[:, :, None], y1[:, None, :]) - torch.maximum(y0[:, :, None], y0[:, None, :])
    inter = iw.clamp(min=0) * ih.clamp(min=0)
    area = (x1 - x0) * (y1 - y0)
    union = area[:, :, None] + area[:, None, :] - inter
    ok = (iw > 0) & (ih > 0) & (area[:, :, None] > 0) & (area[:, None, :] > 0) & (union > 0)
    return ok & (inter / torch.where(union > 0, union, torch.ones_like(union)) > threshold)


@describe("NonMaxSuppression", no_gradient="an integer result (the selected boxes' indices)")
@register("NonMaxSuppression", since=10)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                        *, center_point_box=0):
    # NOTE: a selection of indices: nothing flows back to boxes or scores.
    boxes, scores = boxes.detach().to(torch.float64), scores.detach().to(torch.float64)
    limit = 0 if max_output_boxes_per_class is None or max_output_boxes_per_class.numel() == 0 else \
        max(int_list(max_output_boxes_per_class)[0], 0)
    iou = 0.0 if iou_threshold is None or iou_threshold.numel() == 0 else iou_threshold.reshape(-1)[0]
    suppress = _iou_suppresses(boxes, center_point_box, iou).tolist()
    keep = None
    if score_threshold is not None and score_threshold.numel():
        keep = (scores > score_threshold.reshape(-1)[0].to(torch.float64)).tolist()
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices.tolist()
    picked = []
    for b, per_class in enumerate(order):
        for c, ranked in enumerate(per_class):
            chosen = []
            for i in ranked:
                if len(chosen) >= limit:
                    break
                if keep is not None and not keep[b][c][i]:
                    continue
                if not any(suppress[b][s][i] for s in chosen):
                    chosen.append(i)
                    picked.append((b, c, i))
    return torch.tensor(picked, dtype=torch.int64, device=boxes.device).reshape(-1, 3)
