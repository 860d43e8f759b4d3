"""Reductions, arg-reductions, cumulative ops, softmax family and TopK."""
from __future__ import annotations

import math

import torch

from ..dtypes import computes_in_float32
from ..registry import describe, register
from .shape import int_list


def _dims(x, axes, noop_with_empty_axes):
    """Normalised reduction dims; () means reduce nothing (each op's element map still applies)."""
    if axes is None or len(axes) == 0:
        return () if noop_with_empty_axes else tuple(range(x.dim()))
    return tuple(sorted({a + x.dim() if a < 0 else a for a in axes}))


_read_axes = int_list


def _reduce(kernel, data, axes, keepdims, noop_with_empty_axes=0):
    return kernel(data, _dims(data, axes, noop_with_empty_axes), bool(keepdims))


def _as_float(x, fn):
    """Apply `fn` in floating point and cast back, as the reference does for integer inputs."""
    return fn(x) if x.is_floating_point() else fn(x.double()).to(x.dtype)


def _sum(x, dims, keep):
    if not dims:
        return x
    if not keep and len(dims) == x.dim():  # to one number: see _mean
        return torch.sum(x, dtype=x.dtype)
    return torch.sum(x, dims, keep, dtype=x.dtype)


def _mean(x, dims, keep):
    if not dims:
        return x
    if x.is_floating_point():  # the common case without a closure per call
        # Everything to one number (a scalar loss): the same value as over the dims, and a backward
        # that expands once where the dims form un-squeezes each axis.
        return torch.mean(x) if not keep and len(dims) == x.dim() else torch.mean(x, dims, keep)
    return _as_float(x, lambda v: torch.mean(v, dims, keep))


def _extreme(x, dims, keep, largest):
    # NOTE: at ties torch.amax/amin split the gradient equally among the tied elements;
    # ONNX defines no gradient there.
    if not dims:
        return x
    if any(x.shape[d] == 0 for d in dims):
        if x.dtype == torch.bool:
            fill = not largest
        elif x.is_floating_point():
            fill = -math.inf if largest else math.inf
        else:
            info = torch.iinfo(x.dtype)
            fill = info.min if largest else info.max
        return torch.full_like(torch.sum(x, dims, keep), fill, dtype=x.dtype)
    return torch.amax(x, dims, keep) if largest else torch.amin(x, dims, keep)


def _max(x, dims, keep):
    return _extreme(x, dims, keep, True)


def _min(x, dims, keep):
    return _extreme(x, dims, keep, False)


def _prod(x, dims, keep):
    for d in reversed(dims):
        x = torch.prod(x, d, keepdim=keep, dtype=x.dtype)
    return x


def _l1(x, dims, keep):
    # NOTE: the derivative of |x| at 0 is taken as 0.
    return _sum(torch.abs(x), dims, keep)


def _l2(x, dims, keep):
    # NOTE: vector_norm gives a zero gradient for an all-zero slice (sqrt alone would give nan).
    if not dims:
        return torch.abs(x)
    return _as_float(x, lambda v: torch.linalg.vector_norm(v, 2, dims, keep))


def _log_sum(x, dims, keep):
    return _as_float(x, lambda v: torch.log(_sum(v, dims, keep)))


def _log_sum_exp(x, dims, keep):
    if not dims:
        return x
    return _as_float(x, lambda v: torch.logsumexp(v, dims, keep))


def _sum_square(x, dims, keep):
    return _sum(x * x, dims, keep)


# ReduceSum took `axes` as an input from opset 13; the other reductions from opset 18.

@describe("ReduceSum", needs="", rule="dX = broadcast(dY, shape(X))  # over axes, keepdims={keepdims}")
@register("ReduceSum", since=13)
def reduce_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_sum, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceSum", since=1, until=12)
def reduce_sum_v1(data, *, axes=None, keepdims=1):
    return _reduce(_sum, data, axes, keepdims)


@describe("ReduceMean", needs="", rule="dX = broadcast(dY, shape(X)) / n   # n elements per reduced group")
@register("ReduceMean", since=18)
def reduce_mean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_mean, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceMean", since=1, until=17)
def reduce_mean_v1(data, *, axes=None, keepdims=1):
    return _reduce(_mean, data, axes, keepdims)


@describe("ReduceMax", needs="in0,out0", rule="dX = dY where X == max, 0 elsewhere (ties share)")
@register("ReduceMax", since=18)
def reduce_max(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_max, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceMax", since=1, until=17)
def reduce_max_v1(data, *, axes=None, keepdims=1):
    return _reduce(_max, data, axes, keepdims)


@describe("ReduceMin", needs="in0,out0", rule="dX = dY where X == min, 0 elsewhere (ties share)")
@register("ReduceMin", since=18)
def reduce_min(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_min, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceMin", since=1, until=17)
def reduce_min_v1(data, *, axes=None, keepdims=1):
    return _reduce(_min, data, axes, keepdims)


@describe("ReduceProd", needs="in0,out0", rule="dX = broadcast(dY) · the product of the others   # Y / X without zeros")
@register("ReduceProd", since=18)
@computes_in_float32  # NOTE: torch's half prod multiplies in half: 3-5 ulps over 64 factors, 8-29 cumulative
def reduce_prod(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_prod, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceProd", since=1, until=17)
@computes_in_float32
def reduce_prod_v1(data, *, axes=None, keepdims=1):
    return _reduce(_prod, data, axes, keepdims)


@describe("ReduceL1", needs="in0", rule="dX = sign(X) · broadcast(dY)")
@register("ReduceL1", since=18)
def reduce_l1(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_l1, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceL1", since=1, until=17)
def reduce_l1_v1(data, *, axes=None, keepdims=1):
    return _reduce(_l1, data, axes, keepdims)


@describe("ReduceL2", needs="in0,out0", rule="dX = X / Y · broadcast(dY)")
@register("ReduceL2", since=18)
def reduce_l2(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_l2, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceL2", since=1, until=17)
def reduce_l2_v1(data, *, axes=None, keepdims=1):
    return _reduce(_l2, data, axes, keepdims)


@describe("ReduceLogSum", needs="in0", rule="dX = broadcast(dY / ΣX)")
@register("ReduceLogSum", since=18)
def reduce_log_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_log_sum, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceLogSum", since=1, until=17)
def reduce_log_sum_v1(data, *, axes=None, keepdims=1):
    return _reduce(_log_sum, data, axes, keepdims)


@describe("ReduceLogSumExp", needs="in0,out0", rule="dX = exp(X − Y) · broadcast(dY)")
@register("ReduceLogSumExp", since=18)
def reduce_log_sum_exp(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_log_sum_exp, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceLogSumExp", since=1, until=17)
def reduce_log_sum_exp_v1(data, *, axes=None, keepdims=1):
    return _reduce(_log_sum_exp, data, axes, keepdims)


@describe("ReduceSumSquare", needs="in0", rule="dX = 2 · X · broadcast(dY)")
@register("ReduceSumSquare", since=18)
def reduce_sum_square(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_sum_square, data, _read_axes(axes), keepdims, noop_with_empty_axes)


@register("ReduceSumSquare", since=1, until=17)
def reduce_sum_square_v1(data, *, axes=None, keepdims=1):
    return _reduce(_sum_square, data, axes, keepdims)


# --- arg-reductions ---------------------------------------------------------------------------

def _arg(fn, x, axis, keepdims, select_last_index):
    d = axis + x.dim() if axis < 0 else axis
    if not select_last_index:
        return fn(x, d, keepdim=bool(keepdims))
    return x.shape[d] - 1 - fn(torch.flip(x, (d,)), d, keepdim=bool(keepdims))


@describe("ArgMax", no_gradient="an integer result")
@register("ArgMax", since=1)
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmax, data, axis, keepdims, select_last_index)


@describe("ArgMin", no_gradient="an integer result")
@register("ArgMin", since=1)
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmin, data, axis, keepdims, select_last_index)


# --- cumulative -------------------------------------------------------------------------------

def _cumulative(fn, x, axis, exclusive, reverse, neutral):
    d = int(axis.reshape(-1).tolist()[0])
    d = d + x.dim() if d < 0 else d
    if reverse:
        x = torch.flip(x, (d,))
    y = fn(x, d, dtype=x.dtype)
    if exclusive and y.shape[d] > 0:
        head = torch.full_like(torch.narrow(y, d, 0, 1), neutral)
        y = torch.cat([head, torch.narrow(y, d, 0, y.shape[d] - 1)], d)
    return torch.flip(y, (d,)) if reverse else y


@describe("CumSum", needs="",
          rule="dX = the cumulative sum of dY the other way along axis   # reverse={reverse}, exclusive={exclusive}")
@register("CumSum", since=11)
def cumsum(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(torch.cumsum, x, axis, exclusive, reverse, 0)


@describe("CumProd", needs="in0,out0",
          rule="dX = the reverse cumulative sum of dY · Y, divided by X   # exact with zeros (counted apart)")
@register("CumProd", since=26)
@computes_in_float32
def cumprod(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(torch.cumprod, x, axis, exclusive, reverse, 1)


# --- softmax family ---------------------------------------------------------------------------

def _hardmax(x, d):
    idx = torch.argmax(x, d, keepdim=True)
    ar = torch.arange(x.shape[d], device=x.device).reshape([-1 if i == d else 1 for i in range(x.dim())])
    return (ar == idx).to(x.dtype)


def _coerced_2d(fn, x, axis):
    # NOTE: before opset 13 these ops flatten the input to 2-D at `axis` and normalise over all
    # trailing dims together, not over the single axis.
    d = axis + x.dim() if axis < 0 else axis
    rows = math.prod(x.shape[:d])
    return fn(x.reshape(rows, math.prod(x.shape[d:])), 1).reshape(x.shape)


def stepwise_softmax(x, axis):
    """torch.softmax, except that half types round after each step as ONNX's reference does."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return torch.softmax(x, axis)
    # NOTE: softmax is invariant to the shift, so the detached max changes no derivative.
    e = torch.exp(x - x.detach().amax(axis, keepdim=True))
    return e / e.sum(axis, keepdim=True)


@describe("Softmax", needs="out0", rule="dX = Y · (dY − Σ_axis(dY · Y))     # axis = {axis}")
@register("Softmax", since=13)
def softmax(x, *, axis=-1):
    return stepwise_softmax(x, axis)


@register("Softmax", since=1, until=12)
def softmax_v1(x, *, axis=1):
    return _coerced_2d(torch.softmax, x, axis)


@describe("LogSoftmax", needs="out0", rule="dX = dY − exp(Y) · Σ_axis(dY)     # axis = {axis}")
@register("LogSoftmax", since=13)
def log_softmax(x, *, axis=-1):
    return torch.log_softmax(x, axis)


@register("LogSoftmax", since=1, until=12)
def log_softmax_v1(x, *, axis=1):
    return _coerced_2d(torch.log_softmax, x, axis)


@describe("Hardmax", needs="", rule="dX = 0                     # piecewise constant (a one-hot of the arg-max)")
@register("Hardmax", since=13)
def hardmax(x, *, axis=-1):
    # NOTE: piecewise constant, so its gradient is zero everywhere it exists.
    return _hardmax(x, axis + x.dim() if axis < 0 else axis)


@register("Hardmax", since=1, until=12)
def hardmax_v1(x, *, axis=1):
    return _coerced_2d(_hardmax, x, axis)


# --- TopK -------------------------------------------------------------------------------------

def _topk(x, k, axis, largest):
    # A stable sort puts equal values in index order, which ONNX requires for ties.
    d = axis + x.dim() if axis < 0 else axis
    values, indices = torch.sort(x, dim=d, descending=bool(largest), stable=True)
    return torch.narrow(values, d, 0, k), torch.narrow(indices, d, 0, k)


@describe("TopK", needs="out1", rule="dX = dValues scattered to the positions Indices names, 0 elsewhere")
@register("TopK", since=11)
def topk(x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002  (ONNX attribute name)
    return _topk(x, int(k.reshape(-1).tolist()[0]), axis, largest)


@register("TopK", since=10, until=10)
def topk_v10(x, k, *, axis=-1):
    return _topk(x, int(k.reshape(-1).tolist()[0]), axis, 1)


@register("TopK", since=1, until=9)
def topk_v1(x, *, k, axis=-1):
    return _topk(x, k, axis, 1)
