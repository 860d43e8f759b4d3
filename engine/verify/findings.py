"""Where NaN/Inf first appears: in the forward values (topological order) or in the backward pass."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..dtypes import parse_device, parse_float_dtype
from ..gradient.prepared import leaf, seed_for
from ..run.plan import Plan
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
    """The first node, walking backwards from y, whose own VJP turns finite gradients into NaN/Inf
    in a gradient that flows toward xs, and the forward value that made it do so.

    Gradients reaching a tensor are sums over its consumers, so each node is replayed alone on
    its recorded inputs and its VJP of the (total) output gradients is judged by itself. Only the
    inputs that depend on xs are judged: the gradient a Pow sends to its constant exponent (NaN
    for negative bases) flows nowhere and explains nothing.
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
        wanted = [k for k, n in enumerate(ins) if n is not None and _float_tensor(env[n]) and env[n].requires_grad]
        if not wanted:
            continue
        args = [None if n is None else env[n].detach() for n in ins]
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
            value, why = _cause(plan, env, step, [n for _, n in outs], ins, bad[0])
            hider = _hidden_by(plan, env, value) if value is not None else None
            if hider is not None:
                why += f", hidden downstream by node {hider.name!r} ({hider.op_type})"
            return Finding("nonfinite-gradient",
                           f"NaN/Inf first appears in the {label} backward pass in the VJP of node {step.name!r} "
                           f"({step.op_type}), in the gradient it sends to {bad[0]!r}: {why}",
                           tensor=bad[0], node=step.name, value=value,
                           hidden_by=None if hider is None else hider.name)
    return None


def _count(v: torch.Tensor) -> str:
    kind = "NaN" if bool(torch.isnan(v).any()) else "Inf"
    return f"{kind} ({int((~torch.isfinite(v)).sum())} of {v.numel()} elements)"


def _cause(plan: Plan, env: dict, step, outs: list[str], ins: list[str | None], target: str
           ) -> tuple[str | None, str]:
    """(the forward value that made the node's VJP non-finite, the words for it). A VJP reads its
    outputs (Softmax, Exp, Sqrt) and inputs; a NaN among them poisons every product. When all are
    finite, the derivative itself is infinite at these values (Sqrt or Log at 0, a division by 0)."""
    for n in outs:
        if _nonfinite(env.get(n)):
            return n, f"its output {n!r} holds {_count(env[n])}"
    for n in ins:
        if n is not None and _nonfinite(env.get(n)):
            return n, f"its input {n!r} holds {_count(env[n])}"
    v = env.get(target)
    zeros = int((v == 0).sum()) if _float_tensor(v) else 0
    at = f" ({target!r} holds {zeros} zero{'s' if zeros != 1 else ''})" if zeros else ""
    return None, f"its forward values are finite, its derivative is not at them{at}"


def _hidden_by(plan: Plan, env: dict, name: str):
    """The first step (topological order) that reads a non-finite value descending from `name`
    and gives finite outputs: where the forward hides the NaN (a Where(IsNaN(s), 0, s)) that
    the backward pass still multiplies by."""
    bad = {name}
    for step in plan.steps:
        ins = {plan.names[s] for s in step.in_slots if s is not None}
        if not ins & bad:
            continue
        outs = [plan.names[s] for s in step.out_slots if s is not None]
        poisoned = [n for n in outs if _nonfinite(env.get(n))]
        if poisoned:
            bad.update(poisoned)
        elif any(_float_tensor(env.get(n)) for n in outs):
            return step
    return None


def nonfinite_origin(model, y: str, xs, zs=(), feeds: Mapping[str, object] | None = None, dy=None, *,
                     device="cpu", dtype=None, seed: int = 0, dims: Mapping[str, int] | None = None) -> Finding | None:
    """Where the NaN/Inf of `Model.gradient(...)` with the same arguments comes from, as `check`
    reports it: the first node producing it in the forward pass when y is not finite, else the
    first node whose VJP makes it (walking back from y). None when everything is finite."""
    spec = model.selection(y, xs, zs)
    dev, fdt = parse_device(device), parse_float_dtype(dtype)
    feeds = dict(feeds or {})
    values = model.selection_values(spec, feeds, seed=seed, dims=dims)
    sources = spec.inputs + model.gradient_extras(spec, feeds)
    plan = model.prepare(sources, [spec.y], device=dev, dtype=fdt, keep_all=True)
    tensors = [model.to_tensor(n, values[n] if n in values else feeds[n], dev, fdt) for n in sources]
    with torch.no_grad():
        env = plan.run_all(tensors)
    y_value = env[spec.y]
    label = str(y_value.dtype).removeprefix("torch.") if isinstance(y_value, torch.Tensor) else "native"
    if _nonfinite(y_value):
        return first_nonfinite_value(plan, env, label)
    n = len(spec.xs)
    leaves = [leaf(spec.xs[k], t) if k < n else t for k, t in enumerate(tensors)]
    return first_nonfinite_gradient(plan, leaves, seed_for(y_value, dy, spec.y), n, label)
