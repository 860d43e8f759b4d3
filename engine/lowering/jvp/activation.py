"""Forward rules of the piecewise-linear activations: the tangent times a 0/1 mask, cast from the
comparison that picks the piece (onnxruntime's broadcasting Where takes two to three times as long as a
Cast and a Mul, and these run once per activation of a convolutional network); HardSwish in float32
with exact HardSigmoid steps instead (STEP below), which onnxruntime keeps in its blocked layout. The
pieces and their bounds are the backward rules' (engine/lowering/activation.py): torch's conventions
at the kinks."""
from __future__ import annotations

from onnx import TensorProto

from ..context import attr
from .layout import affine
from .registry import jvp_rule

# NOTE: every float32 other than ±3 lies at least 2^-22 from ±3 (the spacing of floats in [2, 4)), so
# HardSigmoid(x; alpha=±STEP, beta=3·STEP) = clip(STEP·(3 ± x), 0, 1) is exactly the 0/1 step there:
# STEP·x is exact (a power of two; beyond 2^98 it overflows to ±inf, still clipped right), and the one
# rounded sum keeps its sign and a magnitude of at least 2^8.
STEP = 2.0 ** 30


def _mask(ctx, op_type: str, x: str, bound, like: str | None = None) -> str:
    """1.0 where `x op_type bound` holds, else 0.0, in the type of `like` (default x; bound: a tensor name or
    a float)."""
    like = like or x
    bound = bound if isinstance(bound, str) else ctx.scalar(bound, like)
    return ctx.op("Cast", [ctx.op(op_type, [x, bound])], to=ctx.elem(like))


def _only_x(ins) -> bool:
    return ins[0] is not None and all(t is None for t in ins[1:])


@jvp_rule("Relu")
def relu(ctx, node, ins):
    """t·[y > 0]: y > 0 exactly where x > 0 (0 at the kink, as torch). Read off y, not x, so that x has no
    reader but the Relu and onnxruntime still fuses the Conv before it with the Relu; a cast comparison,
    not Sign(y), which onnxruntime runs about three times slower (mobilenetv3 at 224: 3.9 -> 3.5x)."""
    return [ctx.op("Mul", [ins[0], _mask(ctx, "Greater", node.output[0], 0.0)])]


@jvp_rule("LeakyRelu")
def leaky_relu(ctx, node, ins):
    """Slope 1 where x > 0, alpha elsewhere: alpha + (1 - alpha)·[x > 0]."""
    x, alpha = node.input[0], float(attr(node, "alpha", 0.01))
    slope = ctx.op("Add", [ctx.op("Mul", [_mask(ctx, "Greater", x, 0.0), ctx.scalar(1.0 - alpha, x)]),
                           ctx.scalar(alpha, x)])
    return [ctx.op("Mul", [ins[0], slope])]


@jvp_rule("HardSigmoid")
def hard_sigmoid(ctx, node, ins):
    """alpha where 0 <= alpha·x + beta <= 1 (both bounds included, as torch's clamp), else 0: where v
    equals its own clip to [0, 1], one comparison where two masks take four ops."""
    x, alpha, beta = node.input[0], float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    v = ctx.op("Add", [ctx.op("Mul", [x, ctx.scalar(alpha, x)]), ctx.scalar(beta, x)])
    clipped = ctx.op("Clip", [v, ctx.scalar(0.0, x), ctx.scalar(1.0, x)])
    inside = ctx.op("Cast", [ctx.op("Equal", [clipped, v])], to=ctx.elem(x))
    return [ctx.op("Mul", [ins[0], ctx.op("Mul", [inside, ctx.scalar(alpha, x)])])]


@jvp_rule("HardSwish")
def hard_swish(ctx, node, ins):
    """0 up to -3, x/3 + 1/2 inside (-3, 3), 1 from 3 on, as torch. In float32 the slope is
    lo + lo·hi·(x/3 - 1/2) with the steps lo = [x > -3] and hi = [x < 3] as HardSigmoids (STEP above)
    and every affine map as layout.affine: six ops where the masks take twelve, and each step a
    HardSigmoid onnxruntime fuses into the Conv before it, so a blocked network stays blocked."""
    x = node.input[0]
    if ctx.elem(x) == TensorProto.FLOAT:
        lo = ctx.op("HardSigmoid", [affine(ctx, x, 1.0, 0.0)], alpha=STEP, beta=3 * STEP)
        hi = ctx.op("HardSigmoid", [affine(ctx, x, 1.0, 0.0)], alpha=-STEP, beta=3 * STEP)
        inside = ctx.op("Mul", [ctx.op("Mul", [lo, hi]), affine(ctx, x, 1.0 / 3.0, -0.5)])
        return [ctx.op("Mul", [ins[0], ctx.op("Add", [lo, inside])])]
    middle = ctx.op("Add", [ctx.op("Div", [x, ctx.scalar(3.0, x)]), ctx.scalar(0.5, x)])
    inside = ctx.op("Mul", [_mask(ctx, "Greater", x, -3.0), _mask(ctx, "Less", x, 3.0)])
    slope = ctx.op("Add", [ctx.op("Mul", [middle, inside]), _mask(ctx, "GreaterOrEqual", x, 3.0)])
    return [ctx.op("Mul", [ins[0], slope])]


@jvp_rule("Clip")
def clip(ctx, node, ins):
    """The tangent of x inside [min, max], bounds included (torch.clamp); a tangent on a bound: transposed."""
    if not _only_x(ins):
        return NotImplemented
    x, inside = node.input[0], None
    for k, op_type in ((1, "GreaterOrEqual"), (2, "LessOrEqual")):
        if len(node.input) > k and node.input[k]:
            mask = _mask(ctx, op_type, x, node.input[k])
            inside = mask if inside is None else ctx.op("Mul", [inside, mask])
    return [ins[0] if inside is None else ctx.op("Mul", [ins[0], inside])]
