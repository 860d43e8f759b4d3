"""Backward rule of Conv: dX by ConvTranspose, dW by a Conv over batch-transposed tensors, dB by ReduceSum."""
from __future__ import annotations

from ..padding import resolve_pads
from .context import attr
from .registry import rule


def explicit_pads(ctx, node, spatial, kernel, strides, dilations):
    """(begin, end) paddings per spatial axis, auto_pad resolved against the static input shape."""
    pads = list(attr(node, "pads", [0] * 2 * len(kernel)))
    auto = attr(node, "auto_pad", "NOTSET") or "NOTSET"
    return resolve_pads(node.op_type, auto, spatial, kernel, strides, dilations, pads)


def geometry(ctx, node, x, kernel=None):
    """Static shape of x, kernel, strides, dilations and explicit paddings of a Conv/pool node."""
    sx = ctx.need_shape(x)
    kernel = list(kernel or attr(node, "kernel_shape"))
    n = len(kernel)
    strides = list(attr(node, "strides", [1] * n))
    dilations = list(attr(node, "dilations", [1] * n))
    begin, end = explicit_pads(ctx, node, sx[2:], kernel, strides, dilations)
    return sx, kernel, strides, dilations, begin, end


def transposed(ctx, g, w, sx, so, kernel, strides, dilations, begin, end, group=1):
    """The adjoint of a strided, dilated, padded convolution: a ConvTranspose that lands on x's shape."""
    output_padding = []
    for i, size in enumerate(sx[2:]):
        o = so[2 + i]
        natural = strides[i] * (o - 1) + (kernel[i] - 1) * dilations[i] + 1 - begin[i] - end[i]
        output_padding.append(size - natural)
    attrs = dict(strides=strides, dilations=dilations, pads=begin + end, group=group)
    if any(output_padding):
        attrs["output_padding"] = output_padding
    return ctx.op("ConvTranspose", [g, w], **attrs)


@rule("Conv")
def conv(ctx, node, grads):
    g, out = grads[0], node.output[0]
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 else ""
    sw = ctx.need_shape(w)
    sx, kernel, strides, dilations, begin, end = geometry(ctx, node, x, sw[2:])
    group = attr(node, "group", 1)
    rank = len(sx)
    result = [None, None, None]
    so = ctx.need_shape(out)
    if ctx.wants(0):
        result[0] = transposed(ctx, g, w, sx, so, kernel, strides, dilations, begin, end, group)
    if ctx.wants(1):
        result[1] = _weight_grad(ctx, g, x, sx, sw, so, strides, dilations, begin, end, group, rank)
    if b and ctx.wants(2):
        result[2] = ctx.reduce_sum(g, [0] + list(range(2, rank)), keepdims=0)
    return result


def _weight_grad(ctx, g, x, sx, sw, so, strides, dilations, begin, end, group, rank):
    """dW[m, c, k] = sum over n, o of g[n, m, o] x[n, c, o·stride + k·dilation]: a Conv whose batch is c,
    whose channels are n (per group), and whose kernel is g, dilated by the forward stride."""
    n, c = sx[0], sx[1]
    spatial = list(range(2, rank))
    if group == 1:
        xt = ctx.op("Transpose", [x], perm=[1, 0] + spatial)
    else:
        cg = c // group
        grouped = ctx.op("Reshape", [x, ctx.ints([n, group, cg] + list(sx[2:]))])
        xt = ctx.op("Transpose", [grouped], perm=[2, 1, 0] + [s + 1 for s in spatial])
        xt = ctx.op("Reshape", [xt, ctx.ints([cg, group * n] + list(sx[2:]))])
    gt = ctx.op("Transpose", [g], perm=[1, 0] + spatial)
    dw = ctx.op("Conv", [xt, gt], strides=dilations, dilations=strides, pads=begin + end, group=group)
    # the correlation can reach past the kernel when the stride does not divide the padded input
    reach = [(sx[2 + i] + begin[i] + end[i] - (so[2 + i] - 1) * strides[i] - 1) // dilations[i] + 1
             for i in range(rank - 2)]
    if list(reach) != list(sw[2:]):
        dw = ctx.op("Slice", [dw, ctx.ints([0] * (rank - 2)), ctx.ints(sw[2:]), ctx.ints(spatial)])
    return ctx.op("Transpose", [dw], perm=[1, 0] + spatial)
