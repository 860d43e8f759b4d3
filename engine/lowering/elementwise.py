"""Backward rules of the elementwise ops (engine/ops/elementwise.py, activation.py) as ONNX nodes."""
from __future__ import annotations

import math

from .context import attr
from .registry import rule


def _both(ctx, node, ga, gb):
    """Reduce each input's gradient over the axes it was broadcast along."""
    out = node.output[0]
    a, b = node.input[0], node.input[1]
    return [ctx.unbroadcast(ga(), a, out) if ctx.wants(0) else None,
            ctx.unbroadcast(gb(), b, out) if ctx.wants(1) else None]


@rule("Add")
def add(ctx, node, grads):
    return _both(ctx, node, lambda: grads[0], lambda: grads[0])


@rule("Sub")
def sub(ctx, node, grads):
    return _both(ctx, node, lambda: grads[0], lambda: ctx.op("Neg", [grads[0]]))


@rule("Mul")
def mul(ctx, node, grads):
    (g,), (a, b) = grads, node.input
    return _both(ctx, node, lambda: ctx.op("Mul", [g, b]), lambda: ctx.op("Mul", [g, a]))


@rule("Div")
def div(ctx, node, grads):
    (g,), b, y = grads, node.input[1], node.output[0]
    # d(a/b)/db = -(a/b)/b, written with the output so a need not be read again
    return _both(ctx, node, lambda: ctx.op("Div", [g, b]),
                 lambda: ctx.op("Neg", [ctx.op("Mul", [g, ctx.op("Div", [y, b])])]))


@rule("Pow")
def pow_(ctx, node, grads):
    (g,), (a, b), y = grads, node.input, node.output[0]
    if ctx.elem(b) != ctx.elem(a):
        b = ctx.op("Cast", [b], to=ctx.elem(a))

    def da():
        b_minus_1 = ctx.op("Sub", [b, ctx.scalar(1.0, a)])
        return ctx.op("Mul", [g, ctx.op("Mul", [b, ctx.op("Pow", [a, b_minus_1])])])

    def db():
        # NOTE: as torch, 0 where a = 0 and b >= 0 (y log a is 0 · -inf there)
        flat = ctx.op("And", [ctx.op("Equal", [a, ctx.scalar(0.0, a)]), ctx.op("GreaterOrEqual", [b, ctx.scalar(0.0, a)])])
        slope = ctx.op("Where", [flat, ctx.scalar(0.0, a), ctx.op("Mul", [y, ctx.op("Log", [a])])])
        return ctx.op("Mul", [g, slope])

    return _both(ctx, node, da, db)


def _times(ctx, g, factor):
    return [ctx.op("Mul", [g, factor])]


@rule("Neg")
def neg(ctx, node, grads):
    return [ctx.op("Neg", [grads[0]])]


@rule("Identity", "OptionalGetElement")
def identity(ctx, node, grads):
    return [grads[0]]


@rule("Dropout")
def dropout(ctx, node, grads):
    """Inference: the identity. Training: y = x / (1 - ratio) where the random mask keeps x, 0 elsewhere;
    the mask is a constant for differentiation, read from the node's own mask output (as the engine)."""
    inputs = list(node.input) + ["", ""]
    training = ctx.value(inputs[2]) if inputs[2] else False
    if training is not None and not bool(training):
        return [grads[0]]
    mask = node.output[1] if len(node.output) > 1 and node.output[1] else ""
    ratio = inputs[1]
    if not mask:
        if ratio and ctx.value(ratio) is not None and float(ctx.value(ratio)) == 0.0:
            return [grads[0]]
        raise ctx.error("Dropout in training mode without its mask output: the random mask cannot be recovered")
    x = node.input[0]
    keep = ctx.op("Sub", [ctx.scalar(1.0, x), ratio if ratio else ctx.scalar(0.5, x)])
    dx = ctx.op("Where", [mask, ctx.op("Div", [grads[0], keep]), ctx.scalar(0.0, x)])
    return [dx if training is not None else ctx.op("Where", [inputs[2], dx, grads[0]])]  # a run-time switch


@rule("Abs")
def abs_(ctx, node, grads):
    return _times(ctx, grads[0], ctx.op("Sign", [node.input[0]]))


@rule("Sqrt")
def sqrt(ctx, node, grads):
    y = node.output[0]
    return [ctx.op("Div", [grads[0], ctx.op("Mul", [y, ctx.scalar(2.0, y)])])]


@rule("Exp")
def exp(ctx, node, grads):
    return _times(ctx, grads[0], node.output[0])


@rule("Log")
def log(ctx, node, grads):
    return [ctx.op("Div", [grads[0], node.input[0]])]


@rule("Reciprocal")
def reciprocal(ctx, node, grads):
    y = node.output[0]
    return [ctx.op("Neg", [ctx.op("Mul", [grads[0], ctx.op("Mul", [y, y])])])]


@rule("Tanh")
def tanh(ctx, node, grads):
    y = node.output[0]
    return _times(ctx, grads[0], ctx.op("Sub", [ctx.scalar(1.0, y), ctx.op("Mul", [y, y])]))


@rule("Sigmoid")
def sigmoid(ctx, node, grads):
    y = node.output[0]
    return _times(ctx, grads[0], ctx.op("Mul", [y, ctx.op("Sub", [ctx.scalar(1.0, y), y])]))


@rule("Erf")
def erf(ctx, node, grads):
    x = node.input[0]
    bell = ctx.op("Exp", [ctx.op("Neg", [ctx.op("Mul", [x, x])])])
    return _times(ctx, grads[0], ctx.op("Mul", [bell, ctx.scalar(2.0 / math.sqrt(math.pi), x)]))


@rule("Sin")
def sin(ctx, node, grads):
    return _times(ctx, grads[0], ctx.op("Cos", [node.input[0]]))


@rule("Cos")
def cos(ctx, node, grads):
    return [ctx.op("Neg", [ctx.op("Mul", [grads[0], ctx.op("Sin", [node.input[0]])])])]


@rule("Sum", "Mean")
def sum_(ctx, node, grads):
    g, out = grads[0], node.output[0]
    if node.op_type == "Mean":
        g = ctx.op("Div", [g, ctx.scalar(float(len(node.input)), out)])
    return [ctx.unbroadcast(g, x, out) if ctx.wants(i) else None for i, x in enumerate(node.input)]


def _share(ctx, pick, g, a, b):
    """g where a wins the comparison, half of g where a and b tie."""
    zero = ctx.scalar(0.0, a)
    wins = ctx.op("Where", [ctx.op(pick, [a, b]), g, zero])
    tie = ctx.op("Where", [ctx.op("Equal", [a, b]), ctx.op("Mul", [g, ctx.scalar(0.5, a)]), zero])
    return ctx.op("Add", [wins, tie])


@rule("Max", "Min")
def max_min(ctx, node, grads):
    """Max/Min of n inputs as the engine folds them: pairwise from the left, ties split equally."""
    # NOTE: ONNX defines no gradient at ties; torch.maximum/minimum (the engine) gives each half.
    pick = "Greater" if node.op_type == "Max" else "Less"
    xs, out = list(node.input), node.output[0]
    folds, start = [xs[0]], len(ctx.nodes)
    for x in xs[1:-1]:
        folds.append(ctx.op(node.op_type, [folds[-1], x]))
    ctx.infer(ctx.nodes[start:], xs)
    results = folds[1:] + [out]
    g, grads_in = grads[0], [None] * len(xs)
    for k in range(len(xs) - 1, 0, -1):
        left, right, res = folds[k - 1], xs[k], results[k - 1]
        grads_in[k] = ctx.unbroadcast(_share(ctx, pick, g, right, left), right, res)
        g = ctx.unbroadcast(_share(ctx, pick, g, left, right), left, res)
    grads_in[0] = g
    return grads_in


@rule("Where")
def where(ctx, node, grads):
    (g,), (cond, a, b), out = grads, node.input, node.output[0]
    zero = ctx.scalar(0.0, out)
    return [None,
            ctx.unbroadcast(ctx.op("Where", [cond, g, zero]), a, out) if ctx.wants(1) else None,
            ctx.unbroadcast(ctx.op("Where", [cond, zero, g]), b, out) if ctx.wants(2) else None]


@rule("Cast")
def cast(ctx, node, grads):
    return [ctx.op("Cast", [grads[0]], to=ctx.elem(node.input[0]))]


@rule("CastLike")
def cast_like(ctx, node, grads):
    return [ctx.op("Cast", [grads[0]], to=ctx.elem(node.input[0])), None]


@rule("Floor", "Ceil", "Round", "Sign", "Hardmax", "Bernoulli", "DynamicQuantizeLinear")
def piecewise_constant(ctx, node, grads):
    """Flat almost everywhere (Bernoulli: a sample): no gradient flows back, as in the engine (which
    also treats DynamicQuantizeLinear's scale as a constant of its input)."""
    return [None] * len(node.input)


@rule("Mod")
def mod(ctx, node, grads):
    """Float Mod: a - q b with q = trunc(a / b) (fmod=1, torch.fmod) or floor(a / b) (fmod=0, Python's %),
    so da = g and db = -q g."""
    (g,), (a, b), out = grads, node.input, node.output[0]
    q = ctx.op("Div", [a, b])
    if attr(node, "fmod", 0):
        q = ctx.op("Mul", [ctx.op("Sign", [q]), ctx.op("Floor", [ctx.op("Abs", [q])])])
    else:
        q = ctx.op("Floor", [q])
        # NOTE: the engine gives the result the divisor's sign with copysign, whose derivative is 0 where
        # the result is 0 (a jump of the function) and NaN where it is NaN (b = 0).
        live = ctx.op("Where", [ctx.op("Equal", [out, ctx.scalar(0.0, out)]), ctx.scalar(0.0, out), ctx.scalar(1.0, out)])
        g = ctx.op("Mul", [g, ctx.op("Add", [live, ctx.op("Mul", [out, ctx.scalar(0.0, out)])])])
    return _both(ctx, node, lambda: g, lambda: ctx.op("Neg", [ctx.op("Mul", [g, q])]))


def _one_minus_square(ctx, x):
    return ctx.op("Sub", [ctx.scalar(1.0, x), ctx.op("Mul", [x, x])])


@rule("Tan")
def tan(ctx, node, grads):
    y = node.output[0]
    return _times(ctx, grads[0], ctx.op("Add", [ctx.scalar(1.0, y), ctx.op("Mul", [y, y])]))


@rule("Asin", "Acos")
def asin_acos(ctx, node, grads):
    x = node.input[0]
    d = ctx.op("Div", [grads[0], ctx.op("Sqrt", [_one_minus_square(ctx, x)])])
    return [d if node.op_type == "Asin" else ctx.op("Neg", [d])]


@rule("Atan")
def atan(ctx, node, grads):
    x = node.input[0]
    return [ctx.op("Div", [grads[0], ctx.op("Add", [ctx.scalar(1.0, x), ctx.op("Mul", [x, x])])])]


@rule("Sinh")
def sinh(ctx, node, grads):
    return _times(ctx, grads[0], ctx.op("Cosh", [node.input[0]]))


@rule("Cosh")
def cosh(ctx, node, grads):
    return _times(ctx, grads[0], ctx.op("Sinh", [node.input[0]]))


@rule("Asinh", "Acosh")
def asinh_acosh(ctx, node, grads):
    """1 / sqrt(x² + 1) and 1 / sqrt(x² - 1)."""
    x = node.input[0]
    shift = ctx.scalar(1.0 if node.op_type == "Asinh" else -1.0, x)
    return [ctx.op("Div", [grads[0], ctx.op("Sqrt", [ctx.op("Add", [ctx.op("Mul", [x, x]), shift])])])]


@rule("Atanh")
def atanh(ctx, node, grads):
    return [ctx.op("Div", [grads[0], _one_minus_square(ctx, node.input[0])])]

