"""Backward rules of engine/ops/reduce.py: the sums and means, Softmax, LogSoftmax."""
from __future__ import annotations

from .context import attr
from .registry import rule


def reduced_axes(ctx, node) -> list[int] | None:
    """The axes a Reduce* node reduces (attribute before opset 18, input after); None for no-op."""
    x = node.input[0]
    rank = ctx.need_rank(x)
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.need_value(node.input[1]).reshape(-1)]
    if not axes:
        return None if attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def spread(ctx, node, g) -> str:
    """g, shaped like the reduced output, broadcast back over the input's shape."""
    x = node.input[0]
    axes = reduced_axes(ctx, node)
    if axes is None:
        return g
    if not attr(node, "keepdims", 1):
        g = ctx.op("Unsqueeze", [g, ctx.ints(axes)])
    return ctx.op("Expand", [g, ctx.op("Shape", [x])])


@rule("ReduceSum")
def reduce_sum(ctx, node, grads):
    return [spread(ctx, node, grads[0])]


@rule("ReduceMean")
def reduce_mean(ctx, node, grads):
    x, out = node.input[0], node.output[0]
    return [ctx.op("Div", [spread(ctx, node, grads[0]), ctx.count_ratio(x, out)])]


@rule("ReduceSumSquare")
def reduce_sum_square(ctx, node, grads):
    x = node.input[0]
    twice = ctx.op("Mul", [x, ctx.scalar(2.0, x)])
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), twice])]


@rule("ReduceL2")
def reduce_l2(ctx, node, grads):
    # NOTE: at a zero norm the derivative does not exist; the division gives NaN, as torch does.
    x, out = node.input[0], node.output[0]
    ratio = ctx.op("Div", [grads[0], out])
    return [ctx.op("Mul", [spread(ctx, node, ratio), x])]


@rule("ReduceLogSumExp")
def reduce_log_sum_exp(ctx, node, grads):
    x, out = node.input[0], node.output[0]
    weights = ctx.op("Exp", [ctx.op("Sub", [x, spread(ctx, node, out)])])
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), weights])]


def _axis(ctx, node) -> int:
    return attr(node, "axis", -1) % ctx.need_rank(node.input[0])


@rule("Softmax")
def softmax(ctx, node, grads):
    """dx = y (g - sum(g y)) along the axis."""
    g, y = grads[0], node.output[0]
    total = ctx.op("ReduceSum", [ctx.op("Mul", [g, y]), ctx.ints([_axis(ctx, node)])], keepdims=1)
    return [ctx.op("Mul", [y, ctx.op("Sub", [g, total])])]


@rule("LogSoftmax")
def log_softmax(ctx, node, grads):
    """dx = g - exp(y) sum(g) along the axis."""
    g, y = grads[0], node.output[0]
    total = ctx.op("ReduceSum", [g, ctx.ints([_axis(ctx, node)])], keepdims=1)
    return [ctx.op("Sub", [g, ctx.op("Mul", [ctx.op("Exp", [y]), total])])]


@rule("ReduceMax", "ReduceMin")
def reduce_max_min(ctx, node, grads):
    """The gradient goes to the extreme elements, split evenly among ties (as torch.amax / amin)."""
    x, out = node.input[0], node.output[0]
    hits = ctx.op("Cast", [ctx.op("Equal", [x, spread(ctx, node, out)])], to=ctx.elem(x))
    axes = reduced_axes(ctx, node)
    counts = hits if axes is None else ctx.op("ReduceSum", [hits, ctx.ints(axes)], keepdims=1)
    share = ctx.op("Div", [hits, counts if axes is None else ctx.op("Expand", [counts, ctx.op("Shape", [x])])])
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), share])]
