"""Second order: the gradient of the gradient, as gradgradcheck does it.

For each x, F(x) = d<dy, y>/dx (the first-order VJP, dy random) is itself differentiated: the
analytic side is d<w, F(x)>/dx through the engine with create_graph=True (a Hessian-vector
product), the numeric side is central differences of <w, F(x)> with F evaluated by the same
backward pass, w random. Batched perturbations go through torch.func.vjp under vmap where the
ops allow, else a loop.
"""
from __future__ import annotations

import torch

from .fd import normal
from .status import INCONCLUSIVE
from .xcheck import XProbe, skipped


def check_second_order(ctx, opts, control) -> tuple:
    spec, model = ctx.spec, ctx.model
    extras = ctx.sources[len(spec.inputs):]
    prepared = model.prepare_gradient(spec.y, spec.xs, spec.zs, device=ctx.device, dtype=torch.float64,
                                      extra_inputs=extras)
    results = []
    for k, name in enumerate(spec.xs):
        i = ctx.sources.index(name)
        x = ctx.tensors64[i]
        if name in ctx.disconnected:
            results.append(skipped(name, x.shape, f"y does not depend on {name!r}"))
            continue
        if control.halted():
            results.append(skipped(name, x.shape, f"not checked ({control.stopped})", INCONCLUSIVE))
            continue
        w = normal(x.shape, [opts.seed, 104729, k], x)
        leaves = [t.detach().clone().requires_grad_() if j < len(spec.xs) else t
                  for j, t in enumerate(ctx.tensors64)]
        with torch.enable_grad():
            first = prepared(*leaves, dy=ctx.dy, create_graph=True).grads[k]
            if not first.requires_grad:  # y is linear in x: the second derivative is zero
                hvp = torch.zeros_like(x)
            else:
                (hvp,) = torch.autograd.grad((first * w).sum(), leaves[k], allow_unused=True)
                hvp = torch.zeros_like(x) if hvp is None else hvp
        f = ctx.x_function(name)
        dy = ctx.dy

        def gradient_at(xx, f=f, dy=dy):
            y, vjp = torch.func.vjp(f, xx)
            if y.shape != dy.shape:  # y's shape moved with x (Unique): F is undefined here; an
                return xx.new_empty((0,))  # output of another shape is what the evaluator flags
            return vjp(dy)[0]

        f0 = first.detach()
        control.plan(2 * (x.numel() if opts.mode == "full" else
                          (min(opts.samples, x.numel()) if opts.mode == "sample" else opts.directions)))
        probe = XProbe(name, gradient_at, x, f0, w, opts, salt=5000 + k, control=control,
                       stage="second order", compress=True)
        results.append(probe.result(probe.judge(hvp.detach())))
    return tuple(results)
