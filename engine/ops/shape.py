"""Shape ops: reshape, transpose, concat/split, slice, squeeze, expand, tile, pad, depth/space."""
from __future__ import annotations

import math

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register


def norm_axis(axis: int, rank: int, op: str = "") -> int:
    """An ONNX axis in [-rank, rank) as a non-negative dim (vmap sees only logical dims)."""
    if not -rank <= axis < rank:
        raise OnnxGradError(f"{op} axis {axis} is out of range for a rank-{rank} tensor")
    return axis + rank if axis < 0 else axis


_INTS = (torch.int64, torch.int32)


def int_list(t: torch.Tensor | None) -> list[int] | None:
    """A shape-like int tensor (shape, axes, pads, repeats, ...) as Python ints."""
    if t is None:
        return None
    if t.dim() == 1 and t.dtype in _INTS:  # the common case: tolist gives Python ints already
        return t.tolist()
    return [int(v) for v in t.reshape(-1).tolist()]


def int_scalar(t: torch.Tensor) -> int:
    return int(t.reshape(-1)[0].item())


# --- Reshape and friends ------------------------------------------------------------------------

def _reshape(x, shape: list[int], allowzero: int = 0):
    if -1 not in shape and (allowzero or 0 not in shape):  # nothing to infer (per-call cost: most reshapes)
        if math.prod(shape) != x.numel():
            raise OnnxGradError(f"Reshape of shape {list(x.shape)} to {shape}: element counts differ"
                                f"{_zero_note(shape, allowzero)}")
        return x.reshape(shape)
    if not allowzero and any(d == 0 and i >= x.dim() for i, d in enumerate(shape)):
        raise OnnxGradError(f"Reshape shape {shape} copies a dim (0) that the rank-{x.dim()} input lacks")
    dims = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if dims.count(-1) > 1:
        raise OnnxGradError(f"Reshape shape {shape} has more than one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or x.numel() % known:
            raise OnnxGradError(f"Reshape cannot infer -1 in {shape} for input shape {list(x.shape)}"
                                f"{_zero_note(shape, allowzero)}")
        dims[dims.index(-1)] = x.numel() // known
    if math.prod(dims) != x.numel():
        raise OnnxGradError(f"Reshape of shape {list(x.shape)} to {dims}: element counts differ"
                            f"{_zero_note(shape, allowzero)}")
    return x.reshape(dims)


def _zero_note(shape: list[int], allowzero: int) -> str:
    """What a 0 in the shape meant, for a refusal it may explain."""
    if 0 not in shape:
        return ""
    return f" (allowzero = {allowzero}: a 0 is {'an empty dim' if allowzero else 'a copy of the input dim'})"


@register("Reshape", since=1, until=4)
def reshape_1(data, *, shape, consumed_inputs=None):
    return _reshape(data, list(shape))


@describe("Reshape", needs="", rule="dX = reshape(dY, shape(X))")
@register("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    return _reshape(data, int_list(shape), allowzero)


@describe("Flatten", needs="", rule="dX = reshape(dY, shape(X))")
@register("Flatten", since=1)
def flatten(x, *, axis=1):
    r = x.dim()
    if not -r <= axis <= r:
        raise OnnxGradError(f"Flatten axis {axis} is out of range for a rank-{r} tensor")
    a = axis + r if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


def _squeeze(x, axes):
    if not axes:  # an empty axes tensor squeezes every 1, as onnxruntime does
        return x.reshape([d for d in x.shape if d != 1])
    dims = {norm_axis(a, x.dim(), "Squeeze") for a in axes}
    if any(x.shape[a] != 1 for a in dims):
        raise OnnxGradError(f"Squeeze axes {axes} include a dim that is not 1 in shape {list(x.shape)}")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in dims])


@register("Squeeze", since=1, until=12)
def squeeze_1(data, *, axes=None):
    return _squeeze(data, axes)


@describe("Squeeze", needs="", rule="dX = reshape(dY, shape(X))")
@register("Squeeze", since=13)
def squeeze(data, axes=None):
    return _squeeze(data, int_list(axes))


def _unsqueeze(x, axes):
    rank = x.dim() + len(axes)
    if len(axes) == 1:  # the common case, without the sort and the repeat check
        dims = list(x.shape)
        dims.insert(norm_axis(axes[0], rank, "Unsqueeze"), 1)
        return x.reshape(dims)
    new = sorted(norm_axis(a, rank, "Unsqueeze") for a in axes)
    if len(set(new)) != len(new):
        raise OnnxGradError(f"Unsqueeze axes {axes} repeat an axis")
    dims = list(x.shape)
    for a in new:
        dims.insert(a, 1)
    return x.reshape(dims)


@register("Unsqueeze", since=1, until=12)
def unsqueeze_1(data, *, axes):
    return _unsqueeze(data, axes)


@describe("Unsqueeze", needs="", rule="dX = reshape(dY, shape(X))")
@register("Unsqueeze", since=13)
def unsqueeze(data, axes):
    return _unsqueeze(data, int_list(axes))


@describe("Transpose", needs="", rule="dX = transpose(dY, inverse(perm))")
@register("Transpose", since=1)
def transpose(data, *, perm=None):
    perm = list(range(data.dim()))[::-1] if perm is None else [norm_axis(p, data.dim()) for p in perm]
    return data.permute(perm)


@describe("Shape", no_gradient="an integer result")
@register("Shape", since=1)
def shape(data, *, start=0, end=None):
    # Python slicing clamps exactly as ONNX asks (negatives count from the back, then clip).
    return torch.tensor(list(data.shape)[start:end], dtype=torch.int64, device=data.device)


@describe("Size", no_gradient="an integer result")
@register("Size", since=1)
def size(data):
    return torch.tensor(data.numel(), dtype=torch.int64, device=data.device)


def broadcast(a, b) -> list[int] | None:
    """numpy's broadcast of two shapes, None when they do not broadcast (torch.broadcast_shapes
    costs more than Expand's own work on small tensors)."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for p, q in zip(a, b):
        if p < 0 or q < 0 or (p != q and p != 1 and q != 1):
            return None
        out.append(q if p == 1 else p)
    return out


@describe("Expand", needs="", rule="dX = unbroadcast(dY)       # summed back to shape(X)")
@register("Expand", since=8)
def expand(x, shape):
    out = broadcast(x.shape, int_list(shape))
    if out is None:
        raise OnnxGradError(f"Expand: shape {int_list(shape)} does not broadcast with {list(x.shape)}")
    return x.expand(out)


@register("Tile", since=1, until=5)
def tile_1(x, tiles, axis):
    reps = [1] * x.dim()
    reps[norm_axis(int_scalar(axis), x.dim(), "Tile")] = int_scalar(tiles)
    return x.repeat(reps)


@describe("Tile", needs="", rule="dX = Σ over the tiles of dY")
@register("Tile", since=6)
def tile(x, repeats):
    reps = int_list(repeats)
    if len(reps) != x.dim():
        raise OnnxGradError(f"Tile: {len(reps)} repeats for a rank-{x.dim()} input")
    return x.repeat(reps) if reps else x


# --- Concat, Split, Slice -----------------------------------------------------------------------

@register("Concat", since=1, until=3)
def concat_1(*inputs, axis=1):
    return torch.cat(inputs, dim=norm_axis(axis, inputs[0].dim(), "Concat"))


@describe("Concat", needs="", rule=("dXᵢ = the slice of dY along axis {axis} at input i's offset",))
@register("Concat", since=4)
def concat(*inputs, axis):
    return torch.cat(inputs, dim=norm_axis(axis, inputs[0].dim(), "Concat"))


def _split(x, split, axis, parts):
    a = norm_axis(axis, x.dim(), "Split")
    d = x.shape[a]
    if not split:  # some exporters write an empty split tensor for "not given"
        if not parts:
            raise OnnxGradError("Split needs split sizes, num_outputs or a known output count")
        step = -(-d // parts)  # ceil: only the last part may be smaller
        split = [step] * (parts - 1) + [d - step * (parts - 1)]
        if split[-1] < 0:
            raise OnnxGradError(f"Split: cannot split a dim of {d} into {parts} parts")
    if sum(split) != d or any(s < 0 for s in split):
        raise OnnxGradError(f"Split sizes {split} do not add up to the dim {d} of axis {a}")
    return tuple(torch.split(x, split, dim=a))


@register("Split", since=1, until=1)
def split_1(x, split_input=None, *, axis=0, split=None, n_outputs):
    return _split(x, split if split_input is None else int_list(split_input), axis, n_outputs)


@register("Split", since=2, until=12)
def split_2(x, *, axis=0, split=None, n_outputs):
    return _split(x, split, axis, n_outputs)


@register("Split", since=13, until=17)
def split_13(x, split=None, *, axis=0, n_outputs):
    return _split(x, int_list(split), axis, n_outputs)


@describe("Split", needs="", rule="dX = concat(dYᵢ for each output, axis {axis})   # a missing one counts as 0")
@register("Split", since=18)
def split_18(x, split=None, *, axis=0, num_outputs=None, n_outputs):
    if split is not None and num_outputs is not None:
        raise OnnxGradError("Split: give either the split input or num_outputs, not both")
    return _split(x, int_list(split), axis, num_outputs or n_outputs)


def _slice(x, starts, ends, axes, steps):
    n = len(starts)
    axes = list(range(n)) if axes is None else [norm_axis(a, x.dim(), "Slice") for a in axes]
    steps = [1] * n if steps is None else steps
    if not len(ends) == len(axes) == len(steps) == n:
        raise OnnxGradError("Slice: starts, ends, axes and steps differ in length")
    for s, e, a, st in zip(starts, ends, axes, steps):
        d = x.shape[a]
        s, e = (s + d if s < 0 else s), (e + d if e < 0 else e)
        if st == 0:
            raise OnnxGradError("Slice: a step of 0 is not allowed")
        if st == 1:  # the same aten::slice view as indexing, without parsing an index tuple
            lo = min(max(s, 0), d)
            x = x.narrow(a, lo, max(min(max(e, 0), d) - lo, 0))
            continue
        if st > 0:
            sl = slice(min(max(s, 0), d), min(max(e, 0), d), st)
        else:
            # torch has no negative steps: walk the flipped axis forward instead.
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            x = x.flip(a)
            sl = slice(d - 1 - s, d - 1 - e, -st)
        x = x[(slice(None),) * a + (sl,)]
    return x


@register("Slice", since=1, until=9)
def slice_1(data, *, starts, ends, axes=None):
    return _slice(data, starts, ends, axes, None)


@describe("Slice", needs="", rule="dX = dY placed back into zeros shaped like X")
@register("Slice", since=10)
def slice_(data, starts, ends, axes=None, steps=None):
    return _slice(data, int_list(starts), int_list(ends), int_list(axes), int_list(steps))


# --- Pad, CenterCropPad ---------------------------------------------------------------------------

def _pad_indices(n_before: int, d: int, n_after: int, mode: str, device) -> torch.Tensor:
    i = torch.arange(-n_before, d + n_after, device=device)
    if mode == "edge":
        return i.clamp(0, d - 1)
    if mode == "wrap":
        return i % d
    if d == 1:
        return torch.zeros_like(i)
    period = 2 * (d - 1)  # reflect without repeating the edge, periodic like numpy
    m = i % period
    return torch.where(m < d, m, period - m)


def _pad(x, pads, mode, value, axes=None):
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise UnsupportedOpError(f"Pad mode {mode!r} is not supported (constant, reflect, edge, wrap are)")
    axes = list(range(x.dim())) if axes is None else [norm_axis(a, x.dim(), "Pad") for a in axes]
    n = len(axes)
    if len(pads) != 2 * n:
        raise OnnxGradError(f"Pad: {len(pads)} pads for {n} axes (need {2 * n})")
    for a, before, after in zip(axes, pads[:n], pads[n:]):
        d = x.shape[a]
        lo, hi = max(-before, 0), d - max(-after, 0)  # negative pads crop
        if lo or hi != d:
            x = x.narrow(a, lo, max(hi - lo, 0))
        before, after, d = max(before, 0), max(after, 0), x.shape[a]
        if not before and not after:
            continue
        if mode == "constant":
            def fill(k, x=x, a=a):
                return value.reshape(()).to(x.dtype).expand(x.shape[:a] + (k,) + x.shape[a + 1:])
            x = torch.cat([fill(before), x, fill(after)], dim=a)
        else:
            if d == 0:
                raise OnnxGradError(f"Pad mode {mode!r} cannot pad the empty axis {a}")
            x = x.index_select(a, _pad_indices(before, d, after, mode, x.device))
    return x


def _value(v, like):
    if isinstance(v, torch.Tensor):
        return v
    return torch.tensor(0.0 if v is None else v, device=like.device).to(like.dtype)


@register("Pad", since=1, until=1)
def pad_1(data, *, paddings, mode="constant", value=0.0):
    return _pad(data, paddings, mode, _value(value, data))


@register("Pad", since=2, until=10)
def pad_2(data, *, pads, mode="constant", value=0.0):
    return _pad(data, pads, mode, _value(value, data))


@register("Pad", since=11, until=17)
def pad_11(data, pads, constant_value=None, *, mode="constant"):
    return _pad(data, int_list(pads), mode, _value(constant_value, data))


@describe("Pad", needs="", rule="dX = the interior of dY (the padding cut away)")
@register("Pad", since=18)
def pad_18(data, pads, constant_value=None, axes=None, *, mode="constant"):
    return _pad(data, int_list(pads), mode, _value(constant_value, data), int_list(axes))


@describe("CenterCropPad", needs="",
          rule="dX = dY placed back: zeros around it where X was cropped, the padding cut away where X was padded")
@register("CenterCropPad", since=18)
def center_crop_pad(input_data, shape, *, axes=None):
    target = int_list(shape)
    axes = list(range(input_data.dim())) if axes is None else axes
    if len(axes) != len(target):
        raise OnnxGradError(f"CenterCropPad: {len(target)} sizes for {len(axes)} axes")
    pads_before, pads_after = [], []
    for a, t in zip(axes, target):
        diff = t - input_data.shape[norm_axis(a, input_data.dim(), "CenterCropPad")]
        # the odd element goes to the end, for crop and pad alike
        half = abs(diff) // 2 if diff >= 0 else -(abs(diff) // 2)
        pads_before.append(half)
        pads_after.append(diff - half)
    return _pad(input_data, pads_before + pads_after, "constant", _value(None, input_data), axes)


# --- DepthToSpace, SpaceToDepth ---------------------------------------------------------------

def _check_mode(op, mode):
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError(f"{op} mode {mode!r} is not supported (DCR and CRD are)")


@describe("DepthToSpace", needs="", rule="dX = dY through the inverse permutation   # blocksize {blocksize}, mode {mode}")
@register("DepthToSpace", since=1)
def depth_to_space(x, *, blocksize, mode="DCR"):
    _check_mode("DepthToSpace", mode)
    b, c, h, w = x.shape
    k = blocksize
    if mode == "DCR":
        y = x.reshape(b, k, k, c // (k * k), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (k * k), k, k, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // (k * k), h * k, w * k)


@describe("SpaceToDepth", needs="", rule="dX = DepthToSpace(dY) in DCR mode   # blocksize {blocksize}")
@register("SpaceToDepth", since=1)
def space_to_depth(x, *, blocksize, mode="DCR"):
    _check_mode("SpaceToDepth", mode)
    b, c, h, w = x.shape
    k = blocksize
    y = x.reshape(b, c, h // k, k, w // k, k)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(b, c * k * k, h // k, w // k)
