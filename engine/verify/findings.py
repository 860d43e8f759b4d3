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
    """The first node, walking backwards from y, whose VJP turns finite output gradients into NaN/Inf."""
    with torch.enable_grad():
        env = plan.run_all(list(leaves))
        y = env[plan.targets[0]]
        names = [n for n, v in env.items() if _float_tensor(v) and v.requires_grad]
        if not y.requires_grad or not names:
            return None
        grads = torch.autograd.grad(y, [env[n] for n in names], dy.to(y.dtype), allow_unused=True)
    grad_of = dict(zip(names, grads))
    for step in reversed(plan.steps):
        outs = [plan.names[s] for s in step.out_slots if s is not None]
        ins = [plan.names[s] for s in step.in_slots if s is not None]
        if any(_nonfinite(grad_of.get(o)) for o in outs):
            continue
        bad = [i for i in ins if _nonfinite(grad_of.get(i))]
        if bad:
            return Finding("nonfinite-gradient",
                           f"NaN/Inf first appears in the {label} backward pass in the VJP of node {step.name!r} "
                           f"({step.op_type}), in the gradient of its input {bad[0]!r}",
                           tensor=bad[0], node=step.name)
    return None
