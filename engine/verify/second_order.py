"""Second order: the gradient of the gradient, as gradgradcheck does it.

For each x, F(x) = d<dy, y>/dx (the first-order VJP, dy random) is itself differentiated: the
analytic side is d<w, F(x)>/dx through the engine with create_graph=True (a Hessian-vector
product), the numeric side is central differences of <w, F(x)> with F evaluated by the same
backward pass, w random. Batched perturbations go through torch.func.vjp under vmap where the
ops allow, else a loop.

`check_second_order_hvp` (check(..., second_order="hvp")) takes H·v along one random direction per x
from the engine's forward over reverse instead: two perturbed gradients instead of two per element.
"""
from __future__ import annotations

import torch

from ..errors import ForwardModeError
from .fd import normal
from .status import INCONCLUSIVE
from .tangent import TangentProbe
from .xcheck import XProbe, skipped


def check_second_order(ctx, opts, control) -> tuple:
    spec, model = ctx.spec, ctx.model
    extras = ctx.sources[len(spec.inputs):]
    prepared = model.prepare_gradient(spec.y, spec.xs, spec.zs, device=ctx.device, dtype=torch.float64,
                                      extra_inputs=extras)
    results = []
    for k, name, x, w in _checked_xs(ctx, opts, control, results):
        leaves = [t.detach().clone().requires_grad_() if j < len(spec.xs) else t
                  for j, t in enumerate(ctx.tensors64)]
        with torch.enable_grad():
            first = prepared(*leaves, dy=ctx.dy, create_graph=True).grads[k]
            if not first.requires_grad:  # y is linear in x: the second derivative is zero
                hvp = torch.zeros_like(x)
            else:
                (hvp,) = torch.autograd.grad((first * w).sum(), leaves[k], allow_unused=True)
                hvp = torch.zeros_like(x) if hvp is None else hvp
        gradient_at = _gradient_of(ctx, name)
        f0 = first.detach()
        control.plan(2 * (x.numel() if opts.mode == "full" else
                          (min(opts.samples, x.numel()) if opts.mode == "sample" else opts.directions)))
        probe = XProbe(name, gradient_at, x, f0, w, opts, salt=5000 + k, control=control,
                       stage="second order", compress=True)
        results.append(probe.result(probe.judge(hvp.detach())))
    return tuple(results)


def _checked_xs(ctx, opts, control, results: list):
    """(k, name, value, a random direction) for each x to check; the skipped result of each other x
    (y does not depend on it, or the check stopped) goes to `results` in its place."""
    for k, name in enumerate(ctx.spec.xs):
        x = ctx.tensors64[ctx.sources.index(name)]
        if name in ctx.disconnected:
            results.append(skipped(name, x.shape, f"y does not depend on {name!r}"))
        elif control.halted():
            results.append(skipped(name, x.shape, f"not checked ({control.stopped})", INCONCLUSIVE))
        else:
            yield k, name, x, normal(x.shape, [opts.seed, 104729, k], x)


def _gradient_of(ctx, name: str):
    """F(x) = d<dy, y>/dx for one x, the rest held, by the same backward as the first order."""
    f, dy = ctx.x_function(name), ctx.dy

    def gradient_at(xx):
        y, vjp = torch.func.vjp(f, xx)
        if y.shape != dy.shape:  # y's shape moved with x (Unique): F is undefined here; an
            return xx.new_empty((0,))  # output of another shape is what the evaluator flags
        return vjp(dy)[0]

    return gradient_at


def check_second_order_hvp(ctx, opts, control) -> tuple:
    """Second order along one random (normal) direction v per x: H·v by the engine's forward over reverse
    (Model.prepare_hvp), against central differences of F along v, element by element of F."""
    spec = ctx.spec
    try:
        prepared = ctx.model.prepare_hvp(spec.y, spec.xs, spec.zs, device=ctx.device, dtype=torch.float64,
                                         extra_inputs=ctx.sources[len(spec.inputs):])
    except ForwardModeError as exc:
        return _refused(ctx, str(exc))
    seeded = {} if ctx.y0.numel() == 1 else {"dy": ctx.dy}  # H of <dy, y>; a scalar y's dy is 1
    results = []
    for k, name, x, v in _checked_xs(ctx, opts, control, results):
        vs = [v if j == k else torch.zeros_like(ctx.tensors64[j]) for j in range(len(spec.xs))]
        try:
            out = prepared(*ctx.tensors64, vs=vs, **seeded)
        except ForwardModeError as exc:
            return _refused(ctx, str(exc))
        gradient_at = _gradient_of(ctx, name)
        with torch.no_grad():  # F at the point by the function differenced: one-sided quotients read from it
            f0 = gradient_at(x)
        probe = TangentProbe(name, gradient_at, x, f0, v, opts, control, stage="second order (H·v)")
        results.append(probe.result(probe.judge(out.hvp[k])))
    return tuple(results)


def _refused(ctx, why: str) -> tuple:
    return tuple(skipped(n, ctx.tensors64[ctx.sources.index(n)].shape, f"H·v not checked: {why}", INCONCLUSIVE)
                 for n in ctx.spec.xs)
