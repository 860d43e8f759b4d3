"""Backward rules of engine/ops/pool.py: MaxPool by its own Indices, the averaging and Lp pools by the
adjoint of a window sum (a ConvTranspose with a kernel of ones), the global pools by broadcasting."""
from __future__ import annotations

import numpy as np
from onnx import helper

from .context import attr
from .conv import Window, adjoint, spatial, window
from .registry import refuse, rule

POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")

refuse("its gradient with respect to the regions and at ties is not lowered", "MaxRoiPool")


@rule("MaxPool")
def max_pool(ctx, node, grads):
    """Send each output's gradient to the input its maximum came from (ties: the first, as torch)."""
    g, x = grads[0], node.input[0]
    if len(node.output) > 1 and node.output[1] and not attr(node, "storage_order", 0):
        indices = node.output[1]
    else:  # row-major indices of our own (storage_order=1 counts column-major)
        kept = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in POOL_ATTRS}
        _, indices = ctx.op("MaxPool", [x], n=2, **kept)
    # Indices count over the whole tensor (batch and channel included), so one flat scatter does it;
    # overlapping windows may pick the same input, hence an added scatter.
    return [ctx.scatter_back(g, x, indices)]


def _extra(ctx, node, x, out, win: Window) -> list[int]:
    """The end padding ceil_mode adds so that the last windows fit (0 without ceil_mode)."""
    if not attr(node, "ceil_mode", 0):
        return [0] * len(win.kernel)
    sx, so = spatial(ctx, x), spatial(ctx, out)
    if sx is None or so is None or None in sx + so:
        raise ctx.error(f"ceil_mode needs the spatial sizes of {x!r} and {out!r}, which shape inference could not find")
    return [max(0, (o - 1) * s + r - (n + b + e))
            for n, o, s, r, b, e in zip(sx, so, win.strides, win.reach, win.begin, win.end)]


def _ones(ctx, x, shape) -> str:
    return ctx.const(np.ones(shape, dtype=helper.tensor_dtype_to_np_dtype(ctx.elem(x))))


def window_sum_adjoint(ctx, node, g, x, out, win: Window, extra) -> str:
    """The adjoint of y = (sum of x over each window): g spread back over every window's inputs; the
    batch and channel axes merge into one so a single-channel ConvTranspose with ones does it."""
    planes = ctx.op("Reshape", [g, ctx.shape_from([-1, 1, ctx.dims(out, 2)])])
    ones = _ones(ctx, x, [1, 1] + list(win.kernel))
    back = adjoint(ctx, planes, ones, x, out, win, end=[e + k for e, k in zip(win.end, extra)])
    return ctx.op("Reshape", [back, ctx.op("Shape", [x])])


@rule("AveragePool")
def average_pool(ctx, node, grads):
    """Each output divided by how many cells its window averaged (input cells, plus the pads when
    count_include_pad, never the cells ceil_mode adds), spread back by the window-sum adjoint."""
    g, x, out = grads[0], node.input[0], node.output[0]
    win = window(ctx, node, x)
    extra = _extra(ctx, node, x, out, win)
    nd = len(win.kernel)
    if not any(win.begin + win.end + tuple(extra)):
        counts = ctx.scalar(float(np.prod(win.kernel)), x)
    else:
        cells = ctx.op("ConstantOfShape", [ctx.shape_from([1, 1, ctx.dims(x, 2)])], value=ctx.tensor_like(1.0, x))
        include = ctx.scalar(float(bool(attr(node, "count_include_pad", 0))), x)
        cells = ctx.op("Pad", [cells, ctx.ints([0, 0, *win.begin, 0, 0, *win.end]), include])
        counts = ctx.op("Conv", [cells, _ones(ctx, x, [1, 1] + list(win.kernel))], strides=list(win.strides),
                        dilations=list(win.dilations), pads=[0] * nd + list(extra))
        counts = ctx.op("Max", [counts, ctx.scalar(1.0, x)])  # a window of pads only reaches no input
    return [window_sum_adjoint(ctx, node, ctx.op("Div", [g, counts]), x, out, win, extra)]


@rule("LpPool")
def lp_pool(ctx, node, grads):
    """y = (sum over the window of |x|^p)^(1/p): dx = sign(x) |x|^(p-1) times the window-sum adjoint of
    g y^(1-p)."""
    # NOTE: where a whole window is zero the derivative is infinite (y^(1-p)); NaN results, as in torch.
    g, x, y = grads[0], node.input[0], node.output[0]
    p = float(attr(node, "p", 2))
    win = window(ctx, node, x)
    scaled = ctx.op("Mul", [g, ctx.op("Pow", [y, ctx.scalar(1.0 - p, y)])])
    spread = window_sum_adjoint(ctx, node, scaled, x, y, win, _extra(ctx, node, x, y, win))
    return [ctx.op("Mul", [spread, _lp_factor(ctx, x, p)])]


def _lp_factor(ctx, x, p: float) -> str:
    """d|x|^p / dx / p = sign(x) |x|^(p-1)."""
    if p == 2.0:
        return x
    if p == 1.0:
        return ctx.op("Sign", [x])
    return ctx.op("Mul", [ctx.op("Sign", [x]), ctx.op("Pow", [ctx.op("Abs", [x]), ctx.scalar(p - 1.0, x)])])


@rule("GlobalAveragePool")
def global_average_pool(ctx, node, grads):
    x, out = node.input[0], node.output[0]
    spread = ctx.op("Expand", [grads[0], ctx.op("Shape", [x])])
    return [ctx.op("Mul", [spread, ctx.per_count(x, out)])]


@rule("GlobalMaxPool")
def global_max_pool(ctx, node, grads):
    """To the maximal elements of each channel, split evenly among ties (as the engine's amax)."""
    x, out = node.input[0], node.output[0]
    shape = ctx.op("Shape", [x])
    hits = ctx.cast(ctx.op("Equal", [x, out]), ctx.wide_type(x))  # counted in float32 for half types, never 0/0
    counts = ctx.op("Max", [ctx.reduce_sum(hits, range(2, ctx.need_rank(x))), ctx.scalar(1.0, hits)])
    share = ctx.narrowed(ctx.op("Div", [hits, counts]), x)
    return [ctx.op("Mul", [ctx.op("Expand", [grads[0], shape]), share])]


@rule("GlobalLpPool")
def global_lp_pool(ctx, node, grads):
    g, x, y = grads[0], node.input[0], node.output[0]
    p = float(attr(node, "p", 2))
    scaled = ctx.op("Mul", [g, ctx.op("Pow", [y, ctx.scalar(1.0 - p, y)])])
    return [ctx.op("Mul", [ctx.op("Expand", [scaled, ctx.op("Shape", [x])]), _lp_factor(ctx, x, p)])]
