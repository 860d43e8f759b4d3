"""Backward rules of Conv and ConvTranspose: each one's input gradient is the other op, the weight
gradient a Conv over batch-transposed tensors, the bias gradient a ReduceSum.

Only the kernel and the attributes must be static; batch and spatial sizes may be symbolic (the
adjoint then lands on the input's size with a Pad read from Shape ops), except where auto_pad SAME
needs the spatial sizes to place its padding.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..padding import resolve_pads
from .context import attr
from .registry import rule


@dataclass(frozen=True)
class Window:
    """A Conv/pool window: kernel, strides, dilations and explicit (begin, end) pads per spatial axis."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]

    @property
    def reach(self) -> tuple[int, ...]:  # the dilated kernel's extent
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))


def spatial(ctx, t) -> tuple[int | None, ...] | None:
    """t's spatial sizes (None where unknown), or None when its rank is unknown."""
    info = ctx.types.get(t)
    return None if info is None or info.shape is None else tuple(info.shape[2:])


def window(ctx, node, x, kernel=None) -> Window:
    kernel = list(kernel or attr(node, "kernel_shape"))
    n = len(kernel)
    strides = list(attr(node, "strides", [1] * n))
    dilations = list(attr(node, "dilations", [1] * n))
    auto = attr(node, "auto_pad", "NOTSET") or "NOTSET"
    sizes = spatial(ctx, x)
    if auto in ("SAME_UPPER", "SAME_LOWER") and (sizes is None or None in sizes):
        raise ctx.error(f"auto_pad={auto} needs the spatial sizes of {x!r}, which shape inference could not find")
    begin, end = resolve_pads(node.op_type, auto, sizes or [0] * n, kernel, strides, dilations,
                              list(attr(node, "pads", [0] * 2 * n)))
    return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end))


def fit(ctx, t, x, begin) -> str:
    """t from `begin` on (per spatial axis), cropped, then zero-padded at the end, to x's spatial sizes (read
    at run time)."""
    rank = ctx.need_rank(x)
    axes = ctx.ints(range(2, rank))
    t = ctx.op("Slice", [t, ctx.ints(begin), ctx.op("Add", [ctx.dims(x, 2), ctx.ints(begin)]), axes])
    short = ctx.op("Sub", [ctx.dims(x, 2), ctx.dims(t, 2)])
    return ctx.op("Pad", [t, ctx.op("Concat", [ctx.ints([0] * (rank + 2)), short], axis=0)])


def adjoint(ctx, g, w, x, out, win: Window, group: int = 1, end=None) -> str:
    """The adjoint of Conv(x, w) with this window, applied to g: a ConvTranspose landing on x's size.
    Rows of x past the last window's reach get nothing (zeros); with static sizes output_padding says
    how many, otherwise the transposed conv keeps its end rows (no end crop) and is fitted to x."""
    end = list(win.end if end is None else end)
    attrs = dict(strides=list(win.strides), dilations=list(win.dilations), group=group)
    sx, so = spatial(ctx, x), spatial(ctx, out)
    if sx is not None and so is not None and None not in sx + so:
        natural = [s * (o - 1) + r - b - e for s, o, r, b, e in zip(win.strides, so, win.reach, win.begin, end)]
        output_padding = [size - n for size, n in zip(sx, natural)]
        if any(output_padding):
            attrs["output_padding"] = output_padding
        return ctx.op("ConvTranspose", [g, w], pads=list(win.begin) + end, **attrs)
    # no pads: a begin pad past the transposed conv's own extent (pads 253 around a 1 x 1 input) would leave
    # onnxruntime an output size <= 0, so the begin rows are sliced off after
    return fit(ctx, ctx.op("ConvTranspose", [g, w], pads=[0] * 2 * len(end), **attrs), x, list(win.begin))


def weight_grad(ctx, g, x, w_shape, win: Window, group: int, end=None) -> str:
    """dW[m, c, k] = sum over n, o of g[n, m, o] x[n, c, o·stride + k·dilation - begin]: a Conv whose
    batch is c, whose channels are n (per group), and whose kernel is g, dilated by the forward stride."""
    rank = len(w_shape)
    axes = list(range(2, rank))
    end = list(win.end if end is None else end)
    if group == 1:
        xt = ctx.op("Transpose", [x], perm=[1, 0] + axes)
    else:
        cg = w_shape[1]
        grouped = ctx.op("Reshape", [x, ctx.shape_from([0, group, cg, ctx.dims(x, 2)])])
        xt = ctx.op("Transpose", [grouped], perm=[2, 1, 0] + [a + 1 for a in axes])
        xt = ctx.op("Reshape", [xt, ctx.shape_from([cg, -1, ctx.dims(x, 2)])])
    gt = ctx.op("Transpose", [g], perm=[1, 0] + axes)
    dw = ctx.op("Conv", [xt, gt], strides=list(win.dilations), dilations=list(win.strides),
                pads=list(win.begin) + end, group=group)
    # the correlation can reach past the kernel when the stride does not divide the padded input
    sx, so = spatial(ctx, x), spatial(ctx, g)
    if sx is None or so is None or None in sx + so or [
            (n + b + e - (o - 1) * s - 1) // d + 1
            for n, b, e, o, s, d in zip(sx, win.begin, end, so, win.strides, win.dilations)] != list(w_shape[2:]):
        dw = ctx.op("Slice", [dw, ctx.ints([0] * (rank - 2)), ctx.ints(w_shape[2:]), ctx.ints(axes)])
    return ctx.op("Transpose", [dw], perm=[1, 0] + axes)


def _bias_grad(ctx, g, rank):
    return ctx.reduce_sum(g, [0] + list(range(2, rank)), keepdims=0)


@rule("Conv")
def conv(ctx, node, grads):
    g, out = grads[0], node.output[0]
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 else ""
    sw = ctx.need_shape(w)
    win = window(ctx, node, x, sw[2:])
    group = attr(node, "group", 1)
    result = [None, None, None]
    if ctx.wants(0):
        result[0] = adjoint(ctx, g, w, x, out, win, group)
    if ctx.wants(1):
        result[1] = weight_grad(ctx, g, x, sw, win, group)
    if b and ctx.wants(2):
        result[2] = _bias_grad(ctx, g, len(sw))
    return result


@rule("ConvTranspose")
def conv_transpose(ctx, node, grads):
    """y = ConvT(x, W) is the adjoint of Conv(·, W) with the same window, so dx = Conv(g, W) and dW is
    the weight gradient of that Conv, with x in the role of its output gradient."""
    g, y = grads[0], node.output[0]
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 else ""
    sw = ctx.need_shape(w)
    win = _transpose_window(ctx, node, x, y, sw[2:])
    nd = len(sw) - 2
    if min(win.begin) < 0:  # y starts before the full transposed conv: those rows got nothing from x
        g = ctx.op("Slice", [g, ctx.ints([max(0, -b) for b in win.begin]), ctx.ints([2**62] * nd), ctx.ints(range(2, nd + 2))])
        win = Window(win.kernel, win.strides, win.dilations, tuple(max(0, b) for b in win.begin), win.end)
    # y's last rows past the full transposed conv (output_padding, a negative end pad) got nothing either
    end = [max(0, e - p) for e, p in zip(win.end, attr(node, "output_padding", [0] * nd))]
    group = attr(node, "group", 1)
    result = [None, None, None]
    if ctx.wants(0):
        dx = ctx.op("Conv", [g, w], strides=list(win.strides), dilations=list(win.dilations),
                    pads=list(win.begin) + end, group=group)
        result[0] = ctx.op("Slice", [dx, ctx.ints([0] * (len(sw) - 2)), ctx.dims(x, 2), ctx.ints(range(2, len(sw)))])
    if ctx.wants(1):
        result[1] = weight_grad(ctx, x, g, sw, win, group, end)
    if b and ctx.wants(2):
        result[2] = _bias_grad(ctx, g, len(sw))
    return result


def _transpose_window(ctx, node, x, y, kernel) -> Window:
    """ConvTranspose's (begin, end) crop, as the engine derives it from pads, output_shape or auto_pad."""
    n = len(kernel)
    strides = list(attr(node, "strides", [1] * n))
    dilations = list(attr(node, "dilations", [1] * n))
    auto = attr(node, "auto_pad", "NOTSET") or "NOTSET"
    if attr(node, "output_shape") or auto in ("SAME_UPPER", "SAME_LOWER"):
        sx, sy = spatial(ctx, x), spatial(ctx, y)
        if sx is None or sy is None or None in sx + sy:
            raise ctx.error("ConvTranspose with output_shape or auto_pad SAME needs static spatial sizes")
        begin, end = [], []
        for i, k in enumerate(kernel):
            full = strides[i] * (sx[i] - 1) + (k - 1) * dilations[i] + 1
            total = full + attr(node, "output_padding", [0] * n)[i] - sy[i]
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = list(attr(node, "pads", [0] * 2 * n))
        begin, end = pads[:n], pads[n:]
    return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end))
