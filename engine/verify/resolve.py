"""Working harder before saying inconclusive, when a comparison was too coarse to mean anything.

A random direction u with a random dy compares <g, u> = dy^T J u, a sum whose terms cancel: on a
detector head of 176,400 outputs it is 1e-3 of its terms, and the roundoff of L = <dy, y> grows
with the terms. Two ways out, both exact identities of the VJP:
- a dy that does not cancel: dy_u = J u, estimated from the two forwards at x +- t u. Then
  dy_u^T J u = |J u|^2, and the engine's VJP at that dy is checked along the same u;
- where y is a scalar (no dy to choose), fresh random directions: a direction that happened to be
  blind (a softmax bias moved along (1, 1, 1)) says nothing, another one does.
What neither settles is left to the nodes (check.py): each node alone is well conditioned.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from . import verdict
from .report import XCheck
from .status import FAIL, INCONCLUSIVE, PASS
from .xcheck import XProbe

# Inconclusive only because the comparison was too coarse: another comparison may settle these.
COARSE = (verdict.UNRESOLVED, verdict.INACCURATE)
MAX_EXTRA = 4  # directions per x measured again


def coarse_items(probe: XProbe) -> np.ndarray | None:
    """The directions of a fast-mode probe left inconclusive only for coarseness; None when anything
    else is at stake (a failure, a kink, NaN, a stop), or for elements."""
    v = probe.verdicts
    if v is None or probe.pert.kind != "directions" or (v.status == FAIL).any():
        return None
    bad = np.nonzero(v.status != PASS)[0]
    if len(bad) == 0 or any(v.causes.get(int(i)) not in COARSE for i in bad):
        return None
    return bad


def settle_directions(ctx, k: int, name: str, probe: XProbe, result: XCheck, opts, control) -> XCheck:
    """`result` for x `name` (the k-th of xs), with its coarse directions compared again: along the
    same u with dy aligned to J u, or (scalar y) along fresh random directions."""
    items = coarse_items(probe)
    if items is None or control.halted():
        return result
    items = items[:MAX_EXTRA]
    x = ctx.tensors64[ctx.sources.index(name)]
    f = ctx.x_function(name)
    memo = ctx.x_memo(name, x.shape)
    if ctx.y0.numel() > 1:
        extras = [_aligned(ctx, k, name, probe, int(i), f, x, opts, control, memo) for i in items]
        extras = [e for e in extras if e is not None]
        how = "aligned dy"
    else:
        fresh = dataclasses.replace(opts, directions=len(items))
        extra = XProbe(name, f, x, ctx.y0, ctx.dy, fresh, salt=7919 + k, control=control, memo=memo,
                       magnitude=lambda: ctx.downstream_magnitude(name))
        extras = [extra.result(extra.judge(ctx.grads64[name]))]
        how = "more directions"
    return merge(result, extras, how) if extras else result


def _aligned(ctx, k: int, name: str, probe: XProbe, item: int, f, x: torch.Tensor, opts, control, memo):
    """The check along direction `item` of `probe` with dy = J u (estimated), or None when y does not
    move along u at all."""
    u = probe.directions[item]
    t = float(probe.pert.step[item, 0])
    with torch.no_grad():
        dy = (f(x + t * u) - f(x - t * u)).to(torch.float64)
    control.tick(2, "aligned dy")
    if not bool(torch.isfinite(dy).all()):
        return None
    rms = float(torch.linalg.vector_norm(dy)) / max(dy.numel(), 1) ** 0.5
    if rms == 0:
        return None
    dy = dy / rms
    grad = ctx.gradient(*ctx.tensors64, dy=dy).grads[k].detach()
    one = dataclasses.replace(opts, directions=1)
    extra = XProbe(name, f, x, ctx.y0, dy, one, salt=7907 + k, control=control, memo=memo,
                   magnitude=lambda: ctx.downstream_magnitude(name), directions=u.unsqueeze(0))
    return extra.result(extra.judge(grad))


def merge(base: XCheck, extras: list[XCheck], how: str) -> XCheck:
    """One x's result from its first comparison and the comparisons made to settle its coarse items:
    a failure anywhere fails it; it passes when every extra comparison passed (the coarse items then
    count as settled, not inconclusive); otherwise it stays inconclusive."""
    failed = base.failed + sum(e.failed for e in extras)
    passed = all(e.status == PASS for e in extras)
    status = FAIL if failed else (PASS if passed else INCONCLUSIVE)
    inconclusive = sum(e.inconclusive for e in extras) + (0 if passed else base.inconclusive)
    lead = next((e for e in extras if e.status == FAIL), None) or (base if passed else next(
        (e for e in extras if e.status != PASS), base))
    worst = {f: getattr(lead, f) for f in ("worst_index", "worst_direction", "analytic", "numeric", "fd_error",
                                           "atol", "signal")}
    errors = [e for e in (base, *extras) if e.max_abs_err is not None]
    reason = (f"{base.inconclusive} of {base.checked} directions were too coarse to resolve with the check's dy; "
              f"compared again ({how}): {', '.join(e.status for e in extras)}")
    if status != PASS and lead.reason:
        reason = f"{lead.reason}; {reason}"
    return dataclasses.replace(
        base, status=status, checked=base.checked + sum(e.checked for e in extras), failed=failed,
        inconclusive=inconclusive, forwards=base.forwards + sum(e.forwards for e in extras),
        max_abs_err=max((e.max_abs_err for e in errors), default=None),
        max_rel_err=max((e.max_rel_err for e in errors), default=None),
        problems=tuple(p for e in (*extras, base) for p in e.problems)[:20], reason=reason,
        resolved_by=how if status == PASS else "", **worst)


ADVICE = {
    verdict.KINK: "the point sits on or near a kink or jump (Relu at 0, a Max tie, Floor): choose other feeds "
                  "(--feeds, or --seed for made-up ones); the node checks show which op sits on it",
    verdict.UNDEFINED: "the model is NaN/Inf, or changes shape, within a step of this point: choose other feeds",
    verdict.UNRESOLVED: "more directions (--directions N), full mode on this x, a dy of your own (--dy), or an "
                        "absolute tolerance you accept (--atol)",
    verdict.INACCURATE: "more directions (--directions N), full mode on this x, or an absolute tolerance you accept "
                        "(--atol)",
    "absorbed": "values downstream of x are so large that the network rounds the steps away: smaller inputs or "
                "weights would let finite differences see the gradient",
}
ZERO_ADVICE = ("the gradient is zero to within what finite differences resolve: an absolute tolerance you accept "
               "(--atol) decides it, or feeds and a dy under which y depends on x")


def advice(result: XCheck, probe: XProbe | None, stopped: str, deterministic: bool) -> str:
    """What would settle an inconclusive x, from why its items were inconclusive."""
    if not deterministic:
        return "make the model deterministic (a random op such as Dropout in training mode)"
    if stopped == "time budget":
        return f"a larger --time-budget: {result.checked} of {result.total if result.kind == 'elements' else '?'} checked"
    if stopped == "cancelled":
        return "run the check again"
    v = probe.verdicts if probe is not None else None
    if v is None or not v.causes:
        return ADVICE[verdict.UNRESOLVED]
    counts: dict[str, int] = {}
    for cause in v.causes.values():
        counts[cause] = counts.get(cause, 0) + 1
    cause = max(counts, key=counts.get)
    if cause in (verdict.UNRESOLVED, verdict.INACCURATE) and v.signal is not None:
        zero = np.nanmax(np.abs(v.signal)) == 0 or np.nanmax(np.abs(probe.analytic)) <= np.nanmax(v.fd_error)
        if zero:
            return ZERO_ADVICE
    return ADVICE.get(cause, ADVICE[verdict.UNRESOLVED])
