"""Forward rules of the elementwise ops: the output tangent is the input tangents times the local
derivatives, read off the forward values (y where the derivative is a function of it, as the backward
rules in engine/lowering/elementwise.py do, so both modes round alike)."""
from __future__ import annotations

from ..registry import BACKWARD
from .core import full
from .layout import affine
from .registry import jvp_rule


def _sum(ctx, terms):
    return ctx.add_all([t for t in terms if t is not None])


@jvp_rule("Add", "Sub")
def add_sub(ctx, node, ins):
    (a, b), y = node.input[:2], node.output[0]
    ta, tb = ins[:2]
    if tb is not None and node.op_type == "Sub":
        if ta is not None:
            return [ctx.op("Sub", [ta, tb])]
        tb = ctx.op("Neg", [tb])
    if ta is not None and tb is not None:
        return [ctx.op("Add", [ta, tb])]  # broadcasts to y's shape as a + b does
    return [full(ctx, ta, y, a) if ta is not None else full(ctx, tb, y, b)]


@jvp_rule("Sum")
def sum_(ctx, node, ins):
    terms = [t for t in ins if t is not None]
    y, sources = node.output[0], [x for x, t in zip(node.input, ins) if t is not None]
    return [full(ctx, ctx.add_all(terms), y, *sources)]


@jvp_rule("Mul")
def mul(ctx, node, ins):
    (a, b), (ta, tb) = node.input[:2], ins[:2]
    swish = _swish(ctx, node, ins)
    if swish is not None:
        return [swish]
    return [_sum(ctx, [ctx.op("Mul", [ta, b]) if ta is not None else None,
                       ctx.op("Mul", [a, tb]) if tb is not None else None])]


def _swish(ctx, node, ins) -> str | None:
    """y = x·Sigmoid(x) (SiLU, as exporters write it): t·s·(1 + x - y), one product where the product
    rule takes two and the Sigmoid's rule two more (the Sigmoid's tangent is then pruned unless read
    elsewhere); 1 - y as layout.affine, so that onnxruntime keeps the whole of it blocked."""
    (a, b), y = node.input[:2], node.output[0]
    for x, s, t in ((a, b, ins[0]), (b, a, ins[1])):
        source = ctx.producers.get(s)
        if t is not None and source is not None and source.op_type == "Sigmoid" and source.domain in ("", "ai.onnx") \
                and source.input[0] == x:
            return ctx.op("Mul", [t, ctx.op("Mul", [s, ctx.op("Add", [x, affine(ctx, y, -1.0, 1.0)])])])
    return None


@jvp_rule("Div")
def div(ctx, node, ins):
    """(ta - y·tb) / b."""
    (_, b), (ta, tb), y = node.input[:2], ins[:2], node.output[0]
    numerator = _sum(ctx, [ta, ctx.op("Neg", [ctx.op("Mul", [y, tb])]) if tb is not None else None])
    return [ctx.op("Div", [numerator, b])]  # numerator ⊇ a's shape or y's: the quotient has y's


@jvp_rule("Pow")
def pow_(ctx, node, ins):
    (a, b), (ta, tb) = node.input[:2], ins[:2]
    if tb is not None:
        return NotImplemented  # a tangent on the exponent: the backward rule's handling of a = 0, transposed
    value = ctx.value(b)
    if value is not None and value.size == 1 and float(value) == 2.0:
        return [ctx.op("Mul", [ta, ctx.op("Mul", [a, ctx.scalar(2.0, a)])])]
    if ctx.elem(b) != ctx.elem(a):
        b = ctx.op("Cast", [b], to=ctx.elem(a))
    slope = ctx.op("Mul", [b, ctx.op("Pow", [a, ctx.op("Sub", [b, ctx.scalar(1.0, a)])])])
    return [ctx.op("Mul", [ta, slope])]


# Every op here maps one tensor elementwise (the others are parameters): its Jacobian is diagonal, J = Jᵀ,
# so its backward rule applied to the tangent is J·v, with the same formula and rounding.
# (Relu, LeakyRelu, HardSigmoid, HardSwish and Clip have rules of their own in activation.py.)
DIAGONAL = ("Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Tanh", "Erf", "Sin", "Cos", "Tan",
            "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "ThresholdedRelu", "Elu",
            "Selu", "Celu", "Softplus", "Softsign", "Shrink", "Gelu", "Mish", "Swish", "PRelu")


@jvp_rule(*DIAGONAL)
def diagonal(ctx, node, ins):
    if ins[0] is None or any(t is not None for t in ins[1:]):
        return NotImplemented  # a tangent on PRelu's slope: the backward rule transposed
    outer = ctx.wanted
    ctx.wanted = (True,) + (False,) * (len(node.input) - 1)
    out = BACKWARD[node.op_type](ctx, node, [ins[0]])[0]
    ctx.wanted = outer
    return [out]


@jvp_rule("Sigmoid")
def sigmoid(ctx, node, ins):
    """t·y·(1 - y), as the backward rule, with 1 - y as layout.affine (blocked where onnxruntime blocks)."""
    y = node.output[0]
    return [ctx.op("Mul", [ins[0], ctx.op("Mul", [y, affine(ctx, y, -1.0, 1.0)])])]


@jvp_rule("Identity")
def identity(ctx, node, ins):
    return [ins[0]]


@jvp_rule("Dropout")
def dropout(ctx, node, ins):
    """Inference (no training_mode, or a constant false one): the identity; training: the backward rule's mask."""
    training = node.input[2] if len(node.input) > 2 else ""
    if training and (ctx.value(training) is None or bool(ctx.value(training))):
        return NotImplemented
    return [ins[0]] + [None] * (len(node.output) - 1)


@jvp_rule("Cast")
def cast(ctx, node, ins):
    return [ctx.op("Cast", [ins[0]], to=ctx.elem(node.output[0]))]


@jvp_rule("CastLike")
def cast_like(ctx, node, ins):
    return [ctx.op("Cast", [ins[0]], to=ctx.elem(node.output[0]))] if ins[0] is not None else [None]


@jvp_rule("Where")
def where(ctx, node, ins):
    (_, a, b), (_, ta, tb), y = node.input[:3], ins[:3], node.output[0]
    zero = ctx.scalar(0.0, y)
    picked = ctx.op("Where", [node.input[0], ta if ta is not None else zero, tb if tb is not None else zero])
    return [full(ctx, picked, y, node.input[0], *[x for x, t in ((a, ta), (b, tb)) if t is not None])]
