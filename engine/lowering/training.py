"""The optimizer steps of ai.onnx.preview.training (engine/ops/training.py) written out in ai.onnx ops,
which runtimes run and the backward rules differentiate (onnxruntime has no kernel for that domain).

Inputs are R (learning rate), T (step count), then groups of equal length: X1..Xn, G1..Gn and the
states; outputs are the new Xs followed by the new states. A step that depends on whether T > 0 is a
Where between two finite values (the other branch's division by zero would be NaN, and reverse mode
multiplies it by the zero Where sends back).
"""
from __future__ import annotations

from onnx import NodeProto

from .context import Ctx, attr

DOMAIN = "ai.onnx.preview.training"


def _groups(ctx: Ctx, node: NodeProto, n_groups: int) -> list[list[str]]:
    tensors = list(node.input[2:])
    if not tensors or len(tensors) % n_groups:
        raise ctx.error(f"expected {n_groups} equal groups of tensors after R and T, got {len(tensors)}")
    n = len(tensors) // n_groups
    return [tensors[k * n:(k + 1) * n] for k in range(n_groups)]


def _emit(ctx: Ctx, node: NodeProto, values: list[str]) -> None:
    for name, value in zip(node.output, values):
        if name:
            ctx.emit("Identity", [value], [name])


def _step(ctx: Ctx, node: NodeProto) -> tuple[str, str]:
    """(T in R's type, T > 0)."""
    r, t = node.input[0], node.input[1]
    step = ctx.op("Cast", [t], to=ctx.elem(r))
    return step, ctx.op("Greater", [step, ctx.scalar(0.0, r)])


def _regularized(ctx: Ctx, node: NodeProto, x: str, g: str) -> str:
    return ctx.op("Add", [ctx.op("Mul", [x, ctx.scalar(attr(node, "norm_coefficient", 0.0), x)]), g])


def _scaled(ctx: Ctx, t: str, factor: float) -> str:
    return ctx.op("Mul", [t, ctx.scalar(factor, t)])


def momentum(ctx: Ctx, node: NodeProto) -> None:
    xs, gs, vs = _groups(ctx, node, 3)
    mode, alpha, beta = attr(node, "mode", "standard"), attr(node, "alpha"), attr(node, "beta")
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"mode {mode!r} has no expansion (standard and nesterov do)")
    r = node.input[0]
    _, started = _step(ctx, node)
    b = ctx.op("Where", [started, ctx.scalar(beta, r), ctx.scalar(1.0, r)])  # the first step takes the whole gradient
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = _regularized(ctx, node, x, g)
        v = ctx.op("Add", [_scaled(ctx, v, alpha), ctx.op("Mul", [ctx.op("CastLike", [b, g]), g])])
        direction = v if mode == "standard" else ctx.op("Add", [g, _scaled(ctx, v, alpha)])
        new_x.append(ctx.op("Sub", [x, ctx.op("Mul", [ctx.op("CastLike", [r, x]), direction])]))
        new_v.append(v)
    _emit(ctx, node, new_x + new_v)


def adagrad(ctx: Ctx, node: NodeProto) -> None:
    xs, gs, hs = _groups(ctx, node, 3)
    r = node.input[0]
    step, _ = _step(ctx, node)
    decay = ctx.op("Add", [ctx.scalar(1.0, r), _scaled(ctx, step, attr(node, "decay_factor", 0.0))])
    rate = ctx.op("Div", [r, decay])
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = _regularized(ctx, node, x, g)
        h = ctx.op("Add", [h, ctx.op("Mul", [g, g])])
        denominator = ctx.op("Add", [ctx.op("Sqrt", [h]), ctx.scalar(attr(node, "epsilon", 1e-6), h)])
        update = ctx.op("Div", [ctx.op("Mul", [ctx.op("CastLike", [rate, g]), g]), denominator])
        new_x.append(ctx.op("Sub", [x, update]))
        new_h.append(h)
    _emit(ctx, node, new_x + new_h)


def adam(ctx: Ctx, node: NodeProto) -> None:
    xs, gs, vs, hs = _groups(ctx, node, 4)
    alpha, beta = attr(node, "alpha", 0.9), attr(node, "beta", 0.999)
    post = attr(node, "norm_coefficient_post", 0.0)
    r = node.input[0]
    step, started = _step(ctx, node)
    one = ctx.scalar(1.0, r)
    correction_v = ctx.op("Sub", [one, ctx.op("Pow", [ctx.scalar(alpha, r), step])])
    correction_h = ctx.op("Sub", [one, ctx.op("Pow", [ctx.scalar(beta, r), step])])
    safe = ctx.op("Where", [started, correction_v, one])  # 1 - alpha^0 is 0
    corrected = ctx.op("Mul", [r, ctx.op("Div", [ctx.op("Sqrt", [correction_h]), safe])])
    rate = ctx.op("Where", [started, corrected, r])
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = _regularized(ctx, node, x, g)
        v = ctx.op("Add", [_scaled(ctx, v, alpha), _scaled(ctx, g, 1 - alpha)])
        h = ctx.op("Add", [_scaled(ctx, h, beta), _scaled(ctx, ctx.op("Mul", [g, g]), 1 - beta)])
        denominator = ctx.op("Add", [ctx.op("Sqrt", [h]), ctx.scalar(attr(node, "epsilon", 1e-6), h)])
        moved = ctx.op("Sub", [x, ctx.op("Div", [ctx.op("Mul", [ctx.op("CastLike", [rate, v]), v]), denominator])])
        new_x.append(_scaled(ctx, moved, 1 - post))
        new_v.append(v)
        new_h.append(h)
    _emit(ctx, node, new_x + new_v + new_h)


OPTIMIZERS = {"Momentum": momentum, "Adagrad": adagrad, "Adam": adam}
