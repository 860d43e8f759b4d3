"""Backward rules of the normalizations in engine/ops/nn.py: BatchNormalization, LayerNormalization,
InstanceNormalization, RMSNormalization, LpNormalization (GroupNormalization goes through its ONNX
function body). Statistics are taken in float32 for half inputs when stash_type says so, as the engine."""
from __future__ import annotations

from onnx import TensorProto

from .context import TypeInfo, attr
from .decompose import through
from .registry import rule

HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _work_type(ctx, node, x) -> int:
    return TensorProto.FLOAT if ctx.elem(x) in HALF and attr(node, "stash_type", 1) == 1 else ctx.elem(x)


def _cast(ctx, t, to: int, like: str) -> str:
    """t (of like's element type) as `to`; the result is typed, so later scalars take `to`."""
    if ctx.elem(like) == to:
        return t
    out = ctx.op("Cast", [t], to=to)
    info = ctx.types.get(t)
    ctx.types[out] = TypeInfo(to, None if info is None else info.shape)
    return out


class Moments:
    """x̂ = (x - mean) / sqrt(var + eps) over `axes` (biased variance), in x's element type."""

    def __init__(self, ctx, x, axes, eps: float):
        self.ctx, self.axes = ctx, list(axes)
        self.centered = ctx.op("Sub", [x, self.mean(x)])
        var = self.mean(ctx.op("Mul", [self.centered, self.centered]))
        self.inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, ctx.scalar(eps, x)])])])
        self.xhat = ctx.op("Mul", [self.centered, self.inv])
        self.x = x

    def mean(self, t):
        return self.ctx.reduce("ReduceMean", t, self.axes)

    def input_grad(self, dxhat) -> str:
        """dx = inv (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂))."""
        ctx = self.ctx
        inner = ctx.op("Sub", [ctx.op("Sub", [dxhat, self.mean(dxhat)]),
                               ctx.op("Mul", [self.xhat, self.mean(ctx.op("Mul", [dxhat, self.xhat]))])])
        return ctx.op("Mul", [self.inv, inner])

    def spread(self, g) -> str:
        """g, one value per normalized slice, on each element of its slice, divided by the slice's size."""
        ctx = self.ctx
        return ctx.op("Mul", [ctx.op("Expand", [g, ctx.op("Shape", [self.x])]), ctx.per_count(self.x, self.inv)])


@rule("LayerNormalization")
def layer_norm(ctx, node, grads):
    """y = scale x̂ + B over the axes from `axis` to the last; Mean and InvStdDev are outputs too."""
    g, g_mean, g_inv = (list(grads) + [None, None])[:3]
    x, scale = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    rank = ctx.need_rank(x)
    axis = attr(node, "axis", -1) % rank
    work = _work_type(ctx, node, x)
    m = Moments(ctx, _cast(ctx, x, work, x), range(axis, rank), attr(node, "epsilon", 1e-5))
    y = node.output[0]
    out = [None, None, None]
    if ctx.wants(0):
        terms = []
        if g is not None:
            terms.append(m.input_grad(_cast(ctx, ctx.op("Mul", [g, scale]), work, x)))
        if g_mean is not None:  # d mean / dx = 1/n
            terms.append(m.spread(g_mean))
        if g_inv is not None:  # d (var + eps)^(-1/2) / dx = -inv³ (x - mean) / n
            cube = ctx.op("Mul", [m.inv, ctx.op("Mul", [m.inv, m.inv])])
            terms.append(ctx.op("Mul", [m.centered, m.spread(ctx.op("Neg", [ctx.op("Mul", [g_inv, cube])]))]))
        out[0] = _cast(ctx, ctx.add_all(terms), ctx.elem(x), m.x) if terms else None
    if g is not None and ctx.wants(1):
        out[1] = ctx.unbroadcast(ctx.op("Mul", [g, _cast(ctx, m.xhat, ctx.elem(x), m.x)]), scale, y)
    if g is not None and bias and ctx.wants(2):
        out[2] = ctx.unbroadcast(g, bias, y)
    return out


@rule("RMSNormalization")
def rms_norm(ctx, node, grads):
    """y = scale x r, r = 1 / sqrt(mean(x²) + eps): dx = r (dŷ - ŷ mean(dŷ ŷ)), ŷ = x r."""
    (g,), (x, scale), y = grads[:1], node.input[:2], node.output[0]
    rank = ctx.need_rank(x)
    axes = list(range(attr(node, "axis", -1) % rank, rank))
    work = _work_type(ctx, node, x)
    xs = _cast(ctx, x, work, x)
    r = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [ctx.reduce("ReduceMean", ctx.op("Mul", [xs, xs]), axes),
                                                             ctx.scalar(attr(node, "epsilon", 1e-5), xs)])])])
    normalized = ctx.op("Mul", [xs, r])
    out = [None, None]
    if ctx.wants(0):
        dn = _cast(ctx, ctx.op("Mul", [g, scale]), work, x)
        inner = ctx.op("Sub", [dn, ctx.op("Mul", [normalized, ctx.reduce("ReduceMean", ctx.op("Mul", [dn, normalized]), axes)])])
        out[0] = _cast(ctx, ctx.op("Mul", [r, inner]), ctx.elem(x), xs)
    if ctx.wants(1):
        out[1] = ctx.unbroadcast(ctx.op("Mul", [g, _cast(ctx, normalized, ctx.elem(x), xs)]), scale, y)
    return out


def _channel_axes(rank):
    return [0] + list(range(2, rank))


def _per_channel(ctx, t, rank):  # [C] -> [1, C, 1, ...] so it broadcasts against x
    return ctx.op("Unsqueeze", [t, ctx.ints([0] + list(range(2, rank)))])


@rule("InstanceNormalization")
def instance_norm(ctx, node, grads):
    """y = scale[c] x̂ + B[c], x̂ over the spatial axes of each (n, c)."""
    g, x, scale = grads[0], node.input[0], node.input[1]
    rank = ctx.need_rank(x)
    m = Moments(ctx, ctx.widened(x), range(2, rank), attr(node, "epsilon", 1e-5))  # float32 statistics, as torch
    out = [None, None, None]
    if ctx.wants(0):
        # cast by x's type: the product is untyped, and widened() takes an unknown type for float32
        scaled = ctx.cast(ctx.op("Mul", [g, _per_channel(ctx, scale, rank)]), ctx.wide_type(x))
        out[0] = ctx.narrowed(m.input_grad(scaled), x)
    if ctx.wants(1):
        out[1] = ctx.reduce_sum(ctx.op("Mul", [g, ctx.narrowed(m.xhat, x)]), _channel_axes(rank), keepdims=0)
    if ctx.wants(2):
        out[2] = ctx.reduce_sum(g, _channel_axes(rank), keepdims=0)
    return out


@rule("BatchNormalization")
def batch_norm(ctx, node, grads):
    """Inference mode: y = scale (x - mean) / sqrt(var + eps) + B, per channel (axis 1); training mode
    (batch statistics, running averages as outputs) through its decomposition."""
    if attr(node, "training_mode", 0):
        return through(ctx, node, grads, lambda: _training(ctx, node))
    if any(grads[1:]):
        raise ctx.error("gradients through an inference BatchNormalization's extra outputs are not lowered")
    g = grads[0]
    x, scale, bias, mean, var = node.input[:5]
    rank = ctx.need_rank(x)
    axes = _channel_axes(rank)
    eps = ctx.scalar(attr(node, "epsilon", 1e-5), x)
    inv = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [var, eps])])])
    scaled_inv = ctx.op("Mul", [scale, inv])
    centered = ctx.op("Sub", [x, _per_channel(ctx, mean, rank)]) if any(ctx.wants(i) for i in (1, 4)) else None
    gsum = ctx.reduce_sum(g, axes, keepdims=0) if any(ctx.wants(i) for i in (2, 3)) else None
    out = [None] * 5
    if ctx.wants(0):
        out[0] = ctx.op("Mul", [g, _per_channel(ctx, scaled_inv, rank)])
    if ctx.wants(1):
        xhat = ctx.op("Mul", [centered, _per_channel(ctx, inv, rank)])
        out[1] = ctx.reduce_sum(ctx.op("Mul", [g, xhat]), axes, keepdims=0)
    if ctx.wants(2):
        out[2] = gsum
    if ctx.wants(3):
        out[3] = ctx.op("Neg", [ctx.op("Mul", [gsum, scaled_inv])])
    if ctx.wants(4):  # d/dvar of (var + eps)^(-1/2) is -1/2 inv^3, which overflows float16 from var < 3e-4
        gc = ctx.widened(ctx.reduce_sum(ctx.op("Mul", [g, centered]), axes, keepdims=0))
        wide_inv = ctx.widened(inv)
        inv3 = ctx.op("Mul", [wide_inv, ctx.op("Mul", [wide_inv, wide_inv])])
        slope = ctx.op("Mul", [ctx.op("Mul", [gc, ctx.op("Mul", [ctx.widened(scale), inv3])]), ctx.scalar(-0.5, gc)])
        out[4] = ctx.narrowed(slope, x)
    return out


def _training(ctx, node):
    x, scale, bias, mean, var = node.input[:5]
    rank = ctx.need_rank(x)
    momentum = attr(node, "momentum", 0.9)
    m = Moments(ctx, x, _channel_axes(rank), attr(node, "epsilon", 1e-5))
    y = ctx.op("Add", [ctx.op("Mul", [m.xhat, _per_channel(ctx, scale, rank)]), _per_channel(ctx, bias, rank)])
    flat = ctx.ints([-1])
    batch_mean = ctx.op("Reshape", [m.mean(x), flat])
    batch_var = ctx.op("Reshape", [m.mean(ctx.op("Mul", [m.centered, m.centered])), flat])

    def running(old, new):
        return ctx.op("Add", [ctx.op("Mul", [old, ctx.scalar(momentum, x)]), ctx.op("Mul", [new, ctx.scalar(1 - momentum, x)])])

    return [y, running(mean, batch_mean), running(var, batch_var)][:len(node.output)]


@rule("LpNormalization")
def lp_norm(ctx, node, grads):
    """y = x / n, n = the p-norm along the axis (an all-zero slice maps to itself, as the engine):
    dx = (g - n' Σ g y) / n with n' = y (p = 2) or sign(x) (p = 1)."""
    g, x, y = grads[0], node.input[0], node.output[0]
    axis = [attr(node, "axis", -1)]
    p = attr(node, "p", 2)
    norm = ctx.reduce("ReduceL2" if p == 2 else "ReduceL1", x, axis)
    zero = ctx.op("Equal", [norm, ctx.scalar(0.0, x)])
    norm = ctx.op("Where", [zero, ctx.scalar(1.0, x), norm])
    along = ctx.reduce_sum(ctx.op("Mul", [g, y]), axis)
    slope = y if p == 2 else ctx.op("Sign", [x])
    return [ctx.op("Div", [ctx.op("Sub", [g, ctx.op("Mul", [slope, along])]), norm])]
