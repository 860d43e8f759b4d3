"""Where NaN/Inf first appears: in the forward values (topological order) or in the backward pass."""
from __future__ import annotations

from typing import Sequence

import torch

from ..plan import Plan
from .report import Finding


def _float_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _nonfinite(v) -> bool:
    return _float_tensor(v) and v.numel() > 0 and not bool(torch.isfinite(v).all())


def first_nonfinite_value(plan: Plan, values: dict[str, torch.Tensor], label: str) -> Finding | None:
    """The first node (topological order) whose float output holds NaN or Inf."""
    for name, v in zip(plan.sources, (values.get(s) for s in plan.sources)):
        if _nonfinite(v):
            return Finding("nonfinite-value", f"input {name!r} already holds NaN/Inf ({label})", tensor=name)
    for step in plan.steps:
        for slot in step.out_slots:
            if slot is None:
                continue
            name = plan.names[slot]
            v = values.get(name)
            if _nonfinite(v):
                kind = "NaN" if bool(torch.isnan(v).any()) else "Inf"
                count = int((~torch.isfinite(v)).sum())
                return Finding("nonfinite-value",
                               f"{kind} first appears in the {label} forward at {name!r} "
                               f"({count} of {v.numel()} elements), produced by node {step.name!r} ({step.op_type})",
                               tensor=name, node=step.name)
    return None


def first_nonfinite_gradient(plan: Plan, leaves: Sequence[torch.Tensor], dy: torch.Tensor,
                             n_xs: int, label: str) -> Finding | None:
    """The first node, walking backwards from y, whose own VJP turns finite gradients into NaN/Inf.

    Gradients reaching a tensor are sums over its consumers, so each node is replayed alone on
    its recorded inputs and its VJP of the (total) output gradients is judged by itself.
    """
    with torch.enable_grad():
        env = plan.run_all(list(leaves))
        y = env[plan.targets[0]]
        names = [n for n, v in env.items() if _float_tensor(v) and v.requires_grad]
        if not y.requires_grad or not names:
            return None
        grads = torch.autograd.grad(y, [env[n] for n in names], dy.to(y.dtype), allow_unused=True)
    grad_of = dict(zip(names, grads))
    for step in reversed(plan.steps):
        outs = [(k, plan.names[s]) for k, s in enumerate(step.out_slots) if s is not None]
        seeds = [(k, grad_of.get(n)) for k, n in outs if grad_of.get(n) is not None]
        if not seeds or any(_nonfinite(g) for _, g in seeds):
            continue
        ins = [plan.names[s] if s is not None else None for s in step.in_slots]
        args = [None if n is None else env[n].detach() for n in ins]
        wanted = [k for k, a in enumerate(args) if _float_tensor(a)]
        args = [a.clone().requires_grad_() if k in wanted else a for k, a in enumerate(args)]
        with torch.enable_grad():
            out = step.fn(*args, **step.kwargs)
            out = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(out[k], g) for k, g in seeds if out[k].requires_grad]
            if not pairs:
                continue
            local = torch.autograd.grad([o for o, _ in pairs], [args[k] for k in wanted],
                                        [g for _, g in pairs], allow_unused=True)
        bad = [ins[k] for k, g in zip(wanted, local) if _nonfinite(g)]
        if bad:
            return Finding("nonfinite-gradient",
                           f"NaN/Inf first appears in the {label} backward pass in the VJP of node {step.name!r} "
                           f"({step.op_type}), in the gradient it sends to {bad[0]!r}",
                           tensor=bad[0], node=step.name)
    return None
