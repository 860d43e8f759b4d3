"""Backward rules of engine/ops/reduce.py: the sums and means, Softmax, LogSoftmax."""
from __future__ import annotations

from .context import attr
from .registry import rule


def reduced_axes(ctx, node) -> list[int] | None:
    """The constant axes a Reduce* node reduces (attribute before opset 18, input after); None for a
    no-op; raises for axes only known at run time (see `dynamic_axes`)."""
    x = node.input[0]
    rank = ctx.need_rank(x)
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.need_value(node.input[1]).reshape(-1)]
    if not axes:
        return None if attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def dynamic_axes(ctx, node) -> str | None:
    """The axes input when only the running model knows it (a graph input, a computed tensor)."""
    axes = node.input[1] if attr(node, "axes") is None and len(node.input) > 1 and node.input[1] else ""
    return axes if axes and ctx.value(axes) is None else None


def _given_axes(ctx, node) -> list[int] | None:
    """The constant axes as written (negative ones too; None: none given), for a rank shape inference lost."""
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.need_value(node.input[1]).reshape(-1)]
    return list(axes) if axes else None


def kept(ctx, node, op_type: str, t: str) -> str:
    """t reduced by op_type over the node's axes, with keepdims=1."""
    axes = dynamic_axes(ctx, node)
    if axes is not None:
        return ctx.op(op_type, [t, axes], keepdims=1, noop_with_empty_axes=attr(node, "noop_with_empty_axes", 0))
    if ctx.rank(node.input[0]) is None:  # the axes as written, which need no rank
        given = _given_axes(ctx, node)
        if given is None:
            return t if attr(node, "noop_with_empty_axes", 0) else ctx.op(op_type, [t], keepdims=1)
        return ctx.reduce(op_type, t, given)
    static = reduced_axes(ctx, node)
    return t if static is None else ctx.reduce(op_type, t, static)


def unreduced(ctx, node, g) -> str:
    """g, shaped like the reduced output, with the reduced axes back as ones (keepdims)."""
    x = node.input[0]
    if not attr(node, "keepdims", 1):
        if dynamic_axes(ctx, node) is not None or ctx.rank(x) is None:
            return ctx.op("Reshape", [g, ctx.op("Shape", [kept(ctx, node, "ReduceSum", x)])])
        axes = reduced_axes(ctx, node)
        if axes is not None:
            return ctx.op("Unsqueeze", [g, ctx.ints(axes)])
    return g


def spread(ctx, node, g) -> str:
    """g, shaped like the reduced output, broadcast back over the input's shape."""
    return ctx.op("Expand", [unreduced(ctx, node, g), ctx.op("Shape", [node.input[0]])])


@rule("ReduceSum")
def reduce_sum(ctx, node, grads):
    return [spread(ctx, node, grads[0])]


@rule("ReduceMean")
def reduce_mean(ctx, node, grads):
    x, out = node.input[0], node.output[0]
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), ctx.per_count(x, out)])]


@rule("ReduceSumSquare")
def reduce_sum_square(ctx, node, grads):
    x = node.input[0]
    twice = ctx.op("Mul", [x, ctx.scalar(2.0, x)])
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), twice])]


@rule("ReduceL2")
def reduce_l2(ctx, node, grads):
    # NOTE: at a zero norm the derivative does not exist; like the engine (torch's vector_norm) it is 0 there.
    x, out = node.input[0], node.output[0]
    zero = ctx.op("Equal", [out, ctx.scalar(0.0, out)])
    ratio = ctx.op("Div", [grads[0], ctx.op("Where", [zero, ctx.scalar(1.0, out), out])])
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
    """The gradient goes to the extreme elements, split evenly among ties (as torch.amax / amin). The
    share is counted in float32 for half types (exact up to 2^24 ties), never 0/0, and the reduced values
    broadcast rather than Expand: onnxruntime without graph optimizations, in float16, compared an expanded
    copy of the max unequal to every element after a Resize (all shares 0/0)."""
    x, out = node.input[0], node.output[0]
    hits = ctx.cast(ctx.op("Equal", [x, unreduced(ctx, node, out)]), ctx.wide_type(x))
    counts = ctx.op("Max", [kept(ctx, node, "ReduceSum", hits), ctx.scalar(1.0, hits)])
    share = ctx.narrowed(ctx.op("Div", [hits, counts]), x)
    return [ctx.op("Mul", [unreduced(ctx, node, grads[0]), share])]


@rule("ReduceL1")
def reduce_l1(ctx, node, grads):
    # NOTE: |x| has no derivative at 0; there the gradient is 0 (sign), as torch.
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), ctx.op("Sign", [node.input[0]])])]


@rule("ReduceLogSum")
def reduce_log_sum(ctx, node, grads):
    """d log(sum x) = g / sum x, the sum being exp(output): g exp(-output), which never overflows."""
    out = node.output[0]
    return [spread(ctx, node, ctx.op("Mul", [grads[0], ctx.op("Exp", [ctx.op("Neg", [out])])]))]


@rule("ReduceProd")
def reduce_prod(ctx, node, grads):
    """Each element gets the product of the others: prod / x without zeros; with one zero in a slice
    only that element gets the product of the rest; with two or more, every element gets 0."""
    x = node.input[0]
    zero, one = ctx.scalar(0.0, x), ctx.scalar(1.0, x)
    is_zero = ctx.op("Equal", [x, zero])
    shape = ctx.op("Shape", [x])
    rest = ctx.op("Expand", [kept(ctx, node, "ReduceProd", ctx.op("Where", [is_zero, one, x])), shape])
    zeros = ctx.op("Expand", [kept(ctx, node, "ReduceSum", ctx.op("Cast", [is_zero], to=ctx.elem(x))), shape])
    lone_zero = ctx.op("Where", [ctx.op("Equal", [zeros, one]), rest, zero])
    no_zero = ctx.op("Where", [ctx.op("Equal", [zeros, zero]), ctx.op("Div", [rest, ctx.op("Where", [is_zero, one, x])]),
                               zero])
    return [ctx.op("Mul", [spread(ctx, node, grads[0]), ctx.op("Where", [is_zero, lone_zero, no_zero])])]


@rule("CumSum")
def cum_sum(ctx, node, grads):
    """Each input counts in the sums after it (before it when reversed): the opposite cumulative sum."""
    return [ctx.op("CumSum", [grads[0], node.input[1]], exclusive=attr(node, "exclusive", 0),
                   reverse=1 - attr(node, "reverse", 0)), None]


@rule("TopK")
def top_k(ctx, node, grads):
    """The values' gradient goes back to the positions their indices name (distinct along the axis)."""
    if grads[0] is None:
        return [None, None]
    x, indices = node.input[0], node.output[1]
    axis = attr(node, "axis", -1)
    return [ctx.op("ScatterElements", [ctx.fill_like(x, 0.0), indices, grads[0]], axis=axis), None]


@rule("CumProd")
def cum_prod(ctx, node, grads):
    """dx_j = sum over the outputs i that include x_j of g_i times the product of their other factors.
    With zeros replaced by 1 (x') and c' the cumulative product of x', nz the running count of zeros:
    a term is c'_i / x'_j when no zero other than x_j is among its factors, else 0. So a nonzero x_j
    gets (reverse cumsum of g c' [nz = 0]) / x_j, a zero x_j the reverse cumsum of g c' [nz = 1]
    (which only its first zero collects): exact with zeros, for any (even run-time) axis."""
    g, (x, axis) = grads[0], node.input[:2]
    exclusive, reverse = attr(node, "exclusive", 0), attr(node, "reverse", 0)
    zero, one = ctx.scalar(0.0, x), ctx.scalar(1.0, x)
    is_zero = ctx.op("Equal", [x, zero])
    nonzero = ctx.op("Where", [is_zero, one, x])
    products = ctx.op("CumProd", [nonzero, axis], exclusive=exclusive, reverse=reverse)
    zeros = ctx.op("CumSum", [ctx.op("Cast", [is_zero], to=ctx.elem(x)), axis], exclusive=exclusive, reverse=reverse)
    weighted = ctx.op("Mul", [g, products])

    def collected(count):
        terms = ctx.op("Where", [ctx.op("Equal", [zeros, ctx.scalar(count, x)]), weighted, zero])
        return ctx.op("CumSum", [terms, axis], exclusive=exclusive, reverse=1 - reverse)

    return [ctx.op("Where", [is_zero, collected(1.0), ctx.op("Div", [collected(0.0), nonzero])]), None]
