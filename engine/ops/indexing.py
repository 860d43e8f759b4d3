"""Index-driven ops: gather/scatter families, NonZero, OneHot, Compress, ReverseSequence, Trilu, Unique."""
from __future__ import annotations

import math

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .shape import int_scalar, norm_axis


def _wrap(indices: torch.Tensor, dim) -> torch.Tensor:
    """ONNX indices may count from the back; `dim` is an int or a tensor broadcasting to them."""
    idx = indices.long()
    return torch.where(idx < 0, idx + dim, idx)


@describe("Gather", needs="in1", rule="dX = scatter-add of dY at the indices along axis {axis}")
@register("Gather", since=1)
def gather(data, indices, *, axis=0):
    a = norm_axis(axis, data.dim(), "Gather")
    if _host_scalar(indices):
        # One constant index (how exporters split a stacked q/k/v): a view, and a backward that
        # writes one slice, where index_select copies and its backward scatters with index_add.
        return data.select(a, int(indices))
    idx = _wrap(indices, data.shape[a])
    try:
        out = data.index_select(a, idx.reshape(-1))
    except (IndexError, RuntimeError):
        _in_bounds("Gather", indices, data.shape[a], axis)
        raise
    return out.reshape(data.shape[:a] + idx.shape + data.shape[a + 1:])


def _in_bounds(op: str, indices: torch.Tensor, n: int, axis: int) -> None:
    """After a kernel failed: the index past the axis it indexes, which `axis` may have been meant to differ."""
    bad = (indices < -n) | (indices >= n)
    if indices.numel() and bool(bad.any()):
        at = [int(i) for i in bad.nonzero()[0]]
        raise OnnxGradError(f"{op}: index {int(indices[tuple(at)])} at {at} is outside [{-n}, {n}), "
                            f"the size of axis {axis}")


def _host_scalar(indices: torch.Tensor) -> bool:
    """A 0-d integer index readable without a device sync, vmap's batching or a compiler's trace."""
    return (indices.dim() == 0 and indices.is_cpu and not indices.is_floating_point()
            and not torch._C._functorch.is_functorch_wrapped_tensor(indices) and not torch.compiler.is_compiling())


@describe("GatherElements", needs="in1", rule="dX = scatter-add of dY at the indices along axis {axis}")
@register("GatherElements", since=11)
def gather_elements(data, indices, *, axis=0):
    a = norm_axis(axis, data.dim(), "GatherElements")
    try:
        return torch.gather(data, a, _wrap(indices, data.shape[a]))
    except (IndexError, RuntimeError):
        _in_bounds("GatherElements", indices, data.shape[a], axis)
        raise


def _nd_index(data_shape, indices):
    """Row-major offsets into data_shape[:k] for each k-tuple in the last axis of `indices`."""
    k = indices.shape[-1]
    lead = torch.tensor(data_shape[:k], dtype=torch.int64, device=indices.device)
    idx = _wrap(indices, lead)
    strides = [math.prod(data_shape[j + 1:k]) for j in range(k)]
    return (idx * torch.tensor(strides, dtype=torch.int64, device=indices.device)).sum(-1)


@describe("GatherND", needs="in1", rule="dX = scatter-add of dY at the index tuples")
@register("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    b = batch_dims
    k = indices.shape[-1]
    if data.shape[:b] != indices.shape[:b]:
        raise OnnxGradError(f"GatherND: the first batch_dims = {b} dims of data {list(data.shape)} and indices "
                            f"{list(indices.shape)} differ")
    if b + k > data.dim():
        raise OnnxGradError(f"GatherND: index tuples of length {k} after batch_dims = {b} exceed the rank of data "
                            f"{list(data.shape)}")
    nb = math.prod(data.shape[:b])
    tail = data.shape[b + k:]
    flat = data.reshape((nb * math.prod(data.shape[b:b + k]),) + tail)
    offsets = _nd_index(data.shape[b:], indices.reshape((nb,) + indices.shape[b:]))
    batch = torch.arange(nb, device=indices.device).reshape((nb,) + (1,) * (offsets.dim() - 1))
    rows = offsets + batch * math.prod(data.shape[b:b + k])
    return flat.index_select(0, rows.reshape(-1)).reshape(indices.shape[:-1] + tail)


_REDUCTIONS = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduce_name(op, reduction):
    if reduction not in _REDUCTIONS:
        raise UnsupportedOpError(f"{op} reduction {reduction!r} is not supported (none, add, mul, max, min are)")
    return _REDUCTIONS[reduction]


def _scatter(op, data, axis, index, updates, reduction):
    # NOTE: with reduction 'none' and repeated indices ONNX leaves the winner undefined.
    if reduction == "none":
        return data.scatter(axis, index, updates)
    return data.scatter_reduce(axis, index, updates, _reduce_name(op, reduction), include_self=True)


@describe("ScatterElements", needs="in1",
          rule=("ddata = dY with the written positions zeroed   # reduction={reduction}: add keeps all of dY; mul, max, min "
                "share it",
                None,
                "dupdates = dY gathered at the indices   # mul, max, min: each factor's or extreme's share"))
@register("ScatterElements", since=11)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    a = norm_axis(axis, data.dim(), "ScatterElements")
    try:
        return _scatter("ScatterElements", data, a, _wrap(indices, data.shape[a]), updates, reduction)
    except (IndexError, RuntimeError):
        _in_bounds("ScatterElements", indices, data.shape[a], axis)
        raise


@describe("Scatter", needs="in1",
          rule=("ddata = dY with the written positions zeroed",
                None,
                "dupdates = dY gathered at the indices along axis {axis}"))
@register("Scatter", since=9, until=10)
def scatter(data, indices, updates, *, axis=0):
    a = norm_axis(axis, data.dim(), "Scatter")
    try:
        return data.scatter(a, _wrap(indices, data.shape[a]), updates)
    except (IndexError, RuntimeError):
        _in_bounds("Scatter", indices, data.shape[a], axis)
        raise


@describe("ScatterND", needs="in1",
          rule=("ddata = dY with the written positions zeroed   # reduction={reduction}: add keeps all of dY; mul, max, min "
                "share it",
                None,
                "dupdates = dY gathered at the index tuples   # mul, max, min: each factor's or extreme's share"))
@register("ScatterND", since=11)
def scatter_nd(data, indices, updates, *, reduction="none"):
    k = indices.shape[-1]
    rows = _nd_index(data.shape, indices).reshape(-1)
    width = math.prod(data.shape[k:])
    flat = data.reshape(math.prod(data.shape[:k]), width)
    upd = updates.reshape(rows.numel(), width)
    out = _scatter("ScatterND", flat, 0, rows[:, None].expand(-1, width), upd, reduction)
    return out.reshape(data.shape)


@describe("NonZero", no_gradient="an integer result")
@register("NonZero", since=9)
def nonzero(x):
    # NOTE: a scalar gives shape (0, N) per the spec (numpy and onnxruntime give (1, N)).
    return torch.nonzero(x).T.contiguous()


@describe("OneHot", needs="in0,in1", rule=(None, None, "dvalues = [Σ dY where not hot, Σ dY where hot]"))
@register("OneHot", since=9)
def one_hot(indices, depth, values, *, axis=-1):
    n = int(depth.reshape(-1)[0].item())
    a = norm_axis(axis, indices.dim() + 1, "OneHot")
    idx = _wrap(indices, n).unsqueeze(a)  # the spec casts float indices to int64 first
    classes = torch.arange(n, device=indices.device).reshape((n,) + (1,) * (indices.dim() - a))
    values = values.reshape(-1)
    return torch.where(idx == classes, values[1], values[0])


@describe("Compress", needs="in1", rule="dX = dY placed back where condition holds, 0 elsewhere")
@register("Compress", since=9)
def compress(x, condition, *, axis=None):
    if axis is None:
        x, a = x.reshape(-1), 0
    else:
        a = norm_axis(axis, x.dim(), "Compress")
    keep = torch.nonzero(condition.reshape(-1).bool()).reshape(-1)
    if keep.numel() and int(keep[-1]) >= x.shape[a]:
        raise OnnxGradError(f"Compress: condition selects index {int(keep[-1])} past the axis length {x.shape[a]}")
    return x.index_select(a, keep)


@describe("ReverseSequence", needs="in1", rule="dX = ReverseSequence(dY)   # it undoes itself")
@register("ReverseSequence", since=10)
def reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0):
    if {batch_axis, time_axis} != {0, 1}:
        raise OnnxGradError(f"ReverseSequence: batch_axis/time_axis must be 0 and 1, got {batch_axis}, {time_axis}")
    t = torch.arange(x.shape[time_axis], device=x.device)[:, None]
    lens = sequence_lens.long().reshape(1, -1)
    src = torch.where(t < lens, lens - 1 - t, t)  # (time, batch)
    if batch_axis == 0:
        src = src.T
    index = src.reshape(src.shape + (1,) * (x.dim() - 2)).expand(x.shape)
    return torch.gather(x, time_axis, index)


@describe("Trilu", needs="", rule="dX = trilu(dY)             # the same triangle (upper={upper})")
@register("Trilu", since=14)
def trilu(x, k=None, *, upper=1):
    diag = 0 if k is None else int_scalar(k)
    return torch.triu(x, diag) if upper else torch.tril(x, diag)


@describe("Unique", needs="out1", rule="dX = dY sent to each value's first occurrence, 0 at the repeats")
@register("Unique", since=11)
def unique(x, *, axis=None, sorted=1, n_outputs=4):  # noqa: A002 - ONNX attribute name
    if axis is None:
        src, a = x.reshape(-1), 0
    else:
        src, a = x, norm_axis(axis, x.dim(), "Unique")
    _, inverse, counts = torch.unique(src, sorted=True, return_inverse=True, return_counts=True,
                                      dim=None if axis is None else a)
    m, n = src.shape[a], counts.numel()
    positions = torch.arange(m, device=x.device)
    first = torch.full((n,), m, dtype=torch.int64, device=x.device)
    first = first.scatter_reduce(0, inverse, positions, "amin", include_self=True)
    if not sorted:
        order = torch.argsort(first)
        rank = torch.empty_like(order).scatter(0, order, torch.arange(n, device=x.device))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    # Y gathered from x (not torch.unique's copy) so that float inputs keep their gradient path.
    outputs = (src.index_select(a, first), first, inverse, counts)
    return outputs[:n_outputs]
