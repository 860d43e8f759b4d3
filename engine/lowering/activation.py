"""Backward rules of engine/ops/activation.py. At a kink each rule takes the side the engine (torch) takes."""
from __future__ import annotations

import math

from .context import attr
from .registry import rule


def _times(ctx, g, factor):
    return [ctx.op("Mul", [g, factor])]


def _where(ctx, cond, a, b):
    return ctx.op("Where", [cond, a, b])


def _above(ctx, x, value=0.0):
    return ctx.op("Greater", [x, ctx.scalar(value, x)])


@rule("Relu")
def relu(ctx, node, grads):
    # NOTE: no derivative at 0; like torch, the gradient there is 0.
    x = node.input[0]
    return [_where(ctx, _above(ctx, x), grads[0], ctx.scalar(0.0, x))]


@rule("LeakyRelu")
def leaky_relu(ctx, node, grads):
    x, g = node.input[0], grads[0]
    return [_where(ctx, _above(ctx, x), g, ctx.op("Mul", [g, ctx.scalar(attr(node, "alpha", 0.01), x)]))]


@rule("PRelu")
def prelu(ctx, node, grads):
    """y = x where x > 0, slope x elsewhere (at 0 the slope side, as the engine)."""
    (g,), (x, slope), y = grads, node.input, node.output[0]
    positive, zero = _above(ctx, x), ctx.scalar(0.0, x)
    dx = _where(ctx, positive, g, ctx.op("Mul", [g, slope])) if ctx.wants(0) else None
    dslope = ctx.unbroadcast(_where(ctx, positive, zero, ctx.op("Mul", [g, x])), slope, y) if ctx.wants(1) else None
    return [dx, dslope]


@rule("ThresholdedRelu")
def thresholded_relu(ctx, node, grads):
    # NOTE: a jump at x = alpha; the derivative there is 0, the left side.
    x = node.input[0]
    return [_where(ctx, _above(ctx, x, attr(node, "alpha", 1.0)), grads[0], ctx.scalar(0.0, x))]


@rule("Elu", "Selu")
def elu(ctx, node, grads):
    """Elu: y = alpha (e^x - 1) for x <= 0, so dy/dx = y + alpha there; Selu is gamma times an Elu."""
    (g,), x, y = grads, node.input[0], node.output[0]
    if node.op_type == "Elu":
        alpha, gamma = attr(node, "alpha", 1.0), 1.0
    else:
        alpha, gamma = attr(node, "alpha", 1.67326319217681884765625), attr(node, "gamma", 1.05070102214813232421875)
    left = ctx.op("Add", [y, ctx.scalar(alpha * gamma, x)])  # gamma (alpha e^x) = y + gamma alpha
    right = ctx.scalar(gamma, x)
    return [ctx.op("Mul", [g, _where(ctx, _above(ctx, x), right, left)])]


@rule("Celu")
def celu(ctx, node, grads):
    x = node.input[0]
    left = ctx.op("Exp", [ctx.op("Div", [x, ctx.scalar(attr(node, "alpha", 1.0), x)])])
    return [ctx.op("Mul", [grads[0], _where(ctx, _above(ctx, x), ctx.scalar(1.0, x), left)])]


@rule("HardSigmoid")
def hard_sigmoid(ctx, node, grads):
    # NOTE: at the ends of the linear segment torch's clamp passes the gradient (bounds included).
    x = node.input[0]
    alpha, beta = attr(node, "alpha", 0.2), attr(node, "beta", 0.5)
    v = ctx.op("Add", [ctx.op("Mul", [x, ctx.scalar(alpha, x)]), ctx.scalar(beta, x)])
    inside = ctx.op("And", [ctx.op("GreaterOrEqual", [v, ctx.scalar(0.0, x)]),
                            ctx.op("LessOrEqual", [v, ctx.scalar(1.0, x)])])
    return [_where(ctx, inside, ctx.op("Mul", [grads[0], ctx.scalar(alpha, x)]), ctx.scalar(0.0, x))]


@rule("HardSwish")
def hard_swish(ctx, node, grads):
    """y = x relu6(x + 3) / 6; as torch (the engine): 0 up to -3, x/3 + 1/2 inside (-3, 3), 1 from 3 on."""
    (g,), x = grads, node.input[0]
    middle = ctx.op("Add", [ctx.op("Div", [x, ctx.scalar(3.0, x)]), ctx.scalar(0.5, x)])
    slope = _where(ctx, ctx.op("LessOrEqual", [x, ctx.scalar(-3.0, x)]), ctx.scalar(0.0, x),
                   _where(ctx, ctx.op("Less", [x, ctx.scalar(3.0, x)]), middle, ctx.scalar(1.0, x)))
    return _times(ctx, g, slope)


@rule("Softplus")
def softplus(ctx, node, grads):
    return _times(ctx, grads[0], ctx.op("Sigmoid", [node.input[0]]))


@rule("Softsign")
def softsign(ctx, node, grads):
    x = node.input[0]
    denominator = ctx.op("Add", [ctx.scalar(1.0, x), ctx.op("Abs", [x])])
    return [ctx.op("Div", [grads[0], ctx.op("Mul", [denominator, denominator])])]


@rule("Shrink")
def shrink(ctx, node, grads):
    x = node.input[0]
    outside = ctx.op("Greater", [ctx.op("Abs", [x]), ctx.scalar(attr(node, "lambd", 0.5), x)])
    return [_where(ctx, outside, grads[0], ctx.scalar(0.0, x))]


@rule("Gelu")
def gelu(ctx, node, grads):
    """none: Φ(x) + x φ(x); tanh: torch's formula for the derivative of its approximation."""
    (g,), like = grads, node.input[0]
    x = ctx.widened(like)  # in float16 x³ overflows from |x| > 40 and 0 · inf would follow, as torch takes float32
    half = ctx.scalar(0.5, x)
    if attr(node, "approximate", "none") == "tanh":
        k_beta, k_kappa = math.sqrt(2.0 / math.pi), 0.044715
        x2 = ctx.op("Mul", [x, x])
        inner = ctx.op("Mul", [ctx.op("Add", [x, ctx.op("Mul", [ctx.op("Mul", [x2, x]), ctx.scalar(k_kappa, x)])]),
                               ctx.scalar(k_beta, x)])
        t = ctx.op("Tanh", [inner])
        left = ctx.op("Mul", [half, ctx.op("Add", [ctx.scalar(1.0, x), t])])
        d_inner = ctx.op("Add", [ctx.scalar(k_beta, x), ctx.op("Mul", [x2, ctx.scalar(3 * k_kappa * k_beta, x)])])
        sech2 = ctx.op("Sub", [ctx.scalar(1.0, x), ctx.op("Mul", [t, t])])
        right = ctx.op("Mul", [ctx.op("Mul", [ctx.op("Mul", [half, x]), sech2]), d_inner])
        return _times(ctx, g, ctx.narrowed(ctx.op("Add", [left, right]), like))
    cdf = ctx.op("Mul", [half, ctx.op("Add", [ctx.scalar(1.0, x),
                                              ctx.op("Erf", [ctx.op("Mul", [x, ctx.scalar(math.sqrt(0.5), x)])])])])
    pdf = ctx.op("Mul", [ctx.op("Exp", [ctx.op("Mul", [ctx.op("Mul", [x, x]), ctx.scalar(-0.5, x)])]),
                         ctx.scalar(1.0 / math.sqrt(2.0 * math.pi), x)])
    return _times(ctx, g, ctx.narrowed(ctx.op("Add", [cdf, ctx.op("Mul", [x, pdf])]), like))


@rule("Mish")
def mish(ctx, node, grads):
    """y = x tanh(softplus(x)): tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2)."""
    x = node.input[0]
    t = ctx.op("Tanh", [ctx.op("Softplus", [x])])
    sech2 = ctx.op("Sub", [ctx.scalar(1.0, x), ctx.op("Mul", [t, t])])
    return _times(ctx, grads[0], ctx.op("Add", [t, ctx.op("Mul", [ctx.op("Mul", [x, ctx.op("Sigmoid", [x])]), sech2])]))


@rule("Swish")
def swish(ctx, node, grads):
    """y = x sigmoid(alpha x): s + alpha x s (1 - s)."""
    x = node.input[0]
    alpha = attr(node, "alpha", 1.0)
    s = ctx.op("Sigmoid", [ctx.op("Mul", [x, ctx.scalar(alpha, x)])])
    ds = ctx.op("Mul", [s, ctx.op("Sub", [ctx.scalar(1.0, x), s])])
    return _times(ctx, grads[0], ctx.op("Add", [s, ctx.op("Mul", [ctx.op("Mul", [x, ctx.scalar(alpha, x)]), ds])]))


@rule("Clip")
def clip(ctx, node, grads):
    """As torch.clamp: x gets the gradient inside [min, max] (bounds included), a bound where it clamps."""
    g, x, out = grads[0], node.input[0], node.output[0]
    low = node.input[1] if len(node.input) > 1 and node.input[1] else ""
    high = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    zero = ctx.scalar(0.0, x)
    result, inside = [None, None, None], None
    for i, bound, outside_op in ((1, low, "Less"), (2, high, "Greater")):
        if not bound:
            continue
        outside = ctx.op(outside_op, [x, bound])
        inside = ctx.op("Not", [outside]) if inside is None else ctx.op("And", [inside, ctx.op("Not", [outside])])
        if ctx.wants(i):
            result[i] = ctx.unbroadcast(_where(ctx, outside, g, zero), bound, out)
    result[0] = g if inside is None else _where(ctx, inside, g, zero)
    return result
