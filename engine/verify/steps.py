"""Measuring again at other steps: what settles coarse items and confirms failures (XProbe.judge).

- `retry`: items left inconclusive by a kink or truncation go down the ladder h/4, h/32, h/256 (under
  a kink crossed within h), items left noisy go up to 8h and 64h (roundoff shrinks); what a rung
  decides is adopted.
- `persist`: a failure counts only when it persists at a smaller step and is above the rounding of
  the values downstream (a jump, a pole, a saturation or an underflow is not a wrong gradient).
- `confirm_directions`: a failing direction re-measured along two nearby ones (kinks that cancel
  along one line).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import absorbed, fd, verdict
from .status import FAIL, INCONCLUSIVE, PASS

if TYPE_CHECKING:
    from .xcheck import XProbe


MAX_RETRIES = 64  # vectors per x re-measured at another step
PERSIST_SCALE = 1 / 16  # a failure must persist at a step at most this fraction of the one it was found at ...
PERSIST_ULPS = 1e3  # ... and at least this many ulps of x
ROUNDING_ULPS = 4.0  # a failure must exceed this many ulps of the values downstream, over the step
MAX_PERSIST = 16  # failing vectors per x measured again at the smaller step


def retry(probe: "XProbe", a: np.ndarray, tol: verdict.Tolerance, v: verdict.Verdicts) -> bool:
    """Other step sizes for items they may settle; adopts the results that conclude.

    A kink crossed at distance c from x (not at x) spoils every step above c: the ladder
    h/4, h/32, h/256 walks under it while roundoff allows. Roundoff that swamps the
    discrepancy shrinks at 8h, then 64h (how much roundoff a forward carries depends on the
    machine's summation order, so one rung settles an item on one CPU and not on another).
    """
    adopted = False
    # Items measured at larger steps (absorbed.py) would read the same rounding again here; and
    # coarse directions that resolve.py compares again with a dy aligned to J u (which removes
    # the cancellation that made them coarse) are not worth more steps first.
    skip = set(probe.laddered.tolist())
    if not probe.retry_coarse:
        skip |= {i for i, c in v.causes.items() if c in (verdict.UNRESOLVED, verdict.INACCURATE)}
    down = [i for i in coarse(v, probe.m, truncation=True) if i not in skip]
    floor = probe.smallest_scale(np.array(down, dtype=np.int64)) if down else 0.0
    for scale in (s for s in (1 / 4, 1 / 32, 1 / 256) if s >= floor):
        down, settled = _retry_at(probe, a, tol, down, scale, truncation=True)
        adopted |= settled
    up = [i for i in coarse(v, probe.m, truncation=False) if i not in skip]
    for scale in (8.0, 64.0):
        up, settled = _retry_at(probe, a, tol, up, scale, truncation=False)
        adopted |= settled
    return adopted


def _retry_at(probe: "XProbe", a, tol, items, scale: float, truncation: bool):
    """(items still inconclusive for the same kind of cause, for the next rung of the ladder;
    whether any item settled) after measuring `items` at scale * h."""
    items = np.array(sorted(items), dtype=np.int64)
    if len(items) == 0 or probe.control.stopped == "cancelled":
        return [], False
    vectors = np.unique(items // probe.rows)[:MAX_RETRIES]
    # Going down, the roundoff is measured again at the rung: a probe against a quotient that
    # carried truncation error (the reason for going down) counted that error as roundoff.
    probes = min(fd.PROBES, len(vectors)) if truncation else 0
    probe.control.plan(2 * (len(vectors) + probes))
    m = fd.measure(probe.objective, probe.x, probe.pert, torch.as_tensor(vectors), probe.opts.chunk, probe.control,
                   "retrying", scale=scale, budget_applies=False, noise_l=None if probes else probe.noise_l,
                   probes=probes)
    fd.refine(probe.objective, probe.x, probe.pert, m, items, probe.opts.chunk, probe.control, "retrying")
    again = verdict.classify(a, m, tol)
    settled = [i for i in items if again.status[i] in (PASS, FAIL)]
    if settled:
        probe.m.take(m, np.array(settled, dtype=np.int64))
    measured, wanted = set(vectors.tolist()), set(items.tolist())
    still = [i for i in coarse(again, m, truncation) if i in wanted and (i // probe.rows) in measured]
    return still, bool(settled)


def persist(probe: "XProbe", a: np.ndarray, tol: verdict.Tolerance, v: verdict.Verdicts) -> None:
    """A failure counts only when it persists at a smaller step (PERSIST_SCALE times h or less).

    A wrong gradient of a smooth function is as wrong at every step. A jump within the step
    (Floor, Round), a pole (Tan) or a staircase of many small jumps is not: its quotient moves
    with the step, or the smaller step passes. The worst failing vectors are measured again
    (MAX_PERSIST of them): an item that passes there is adopted, one whose estimate moved beyond
    both error estimates, or that the smaller step cannot decide, is inconclusive, and one that
    stays as wrong is confirmed. The step is as small as still resolves the discrepancy: a
    saturating or stepped function shows itself only under its own scale. When none of the
    examined failures is confirmed, the unexamined ones are not trusted either.
    """
    fails = np.nonzero((v.status == FAIL) & np.isfinite(a))[0]
    fails = np.setdiff1d(fails, probe.laddered)  # measured at larger steps, against another rung already
    if len(fails) == 0 or probe.control.stopped == "cancelled":
        return
    fails = _above_rounding(probe, a, v, fails)
    if len(fails) == 0:
        return
    worst = fails[np.argsort(-np.nan_to_num(v.ratio[fails], nan=np.inf))]
    vectors = np.array(list(dict.fromkeys((worst // probe.rows).tolist()))[:MAX_PERSIST], dtype=np.int64)
    items = worst[np.isin(worst // probe.rows, vectors)]
    scale = _persist_scale(probe, v, items)
    if scale is None:  # every smaller step is rounded away downstream: nothing can confirm it
        for i in fails.tolist():
            v.status[i] = INCONCLUSIVE
            v.causes[i] = absorbed.ABSORBED
            v.reasons[i] = (f"analytic {a[i]:.6g} vs numeric {v.numeric[i]:.6g}, but no smaller step can confirm "
                            f"it: values downstream reach {probe.downstream_magnitude():.3g}, and the network "
                            "rounds smaller steps away")
        return
    m = _measured_at(probe, vectors, items, scale)
    confirmed = _compared_again(probe, a, v, m, verdict.classify(a, m, tol), items, scale)
    if confirmed == 0:
        for i in np.setdiff1d(fails, items).tolist():
            v.status[i] = INCONCLUSIVE
            v.causes[i] = verdict.KINK
            v.reasons[i] = ("not confirmed: none of the worst failures persisted at a smaller step, so this "
                            "one is not trusted either")


def _persist_scale(probe: "XProbe", v: verdict.Verdicts, items: np.ndarray) -> float | None:
    """The smaller step for `items`, as a fraction of h; None when every step under PERSIST_SCALE
    is rounded away downstream.

    As small a step as still resolves every examined discrepancy (its roundoff under an eighth
    of it): a saturating or stepped function shows itself only once the step is under its scale.
    Roundoff here is the eps * sum |dy * y| bound, never the probes' measure: a probe against a
    quotient that has not converged (the case in question) counts the truncation as roundoff,
    and that inflated noise would make a saturated quotient look like a settled one. The step
    is not so small that x + step rounds: PERSIST_ULPS ulps of x's largest value at least.
    """
    bound = fd.measure_bound(probe.objective, probe.pert, items)
    with np.errstate(divide="ignore", invalid="ignore"):
        needed = float(np.nanmax(8 * bound / v.abs_err[items]))
    floor = probe.smallest_scale(items)
    if floor > PERSIST_SCALE:
        return None
    return float(min(max(needed if np.isfinite(needed) else 0.0, floor), PERSIST_SCALE))


def _measured_at(probe: "XProbe", vectors: np.ndarray, items: np.ndarray, scale: float) -> fd.Measurement:
    """`vectors` measured at scale * h, and `items` refined there."""
    # A second judge of the same x (with the analytic roundoff, check.py) reuses the measurement.
    key = (tuple(np.sort(vectors).tolist()), scale)
    m = probe._persisted.get(key)
    if m is None:
        probe.control.plan(4 * len(vectors))
        m = fd.measure(probe.objective, probe.x, probe.pert, torch.as_tensor(np.sort(vectors)), probe.opts.chunk,
                       probe.control, "confirming", scale=scale, budget_applies=False)
        fd.refine(probe.objective, probe.x, probe.pert, m, items, probe.opts.chunk, probe.control, "confirming")
        probe._persisted = {key: m}
    return m


def _compared_again(probe: "XProbe", a: np.ndarray, v: verdict.Verdicts, m: fd.Measurement,
                    again: verdict.Verdicts, items: np.ndarray, scale: float) -> int:
    """How many failing `items` the smaller step confirms; those it passes are adopted into probe.m
    and `v`, those whose estimate moved (or that it cannot decide) become inconclusive."""
    confirmed = 0
    for i in items.tolist():
        moved = abs(again.numeric[i] - v.numeric[i]) > again.fd_error[i] + v.fd_error[i]
        if again.status[i] == PASS:
            probe.m.take(m, np.array([i]))
            for field in ("numeric", "fd_error", "abs_err", "rel_err", "ratio"):
                getattr(v, field)[i] = getattr(again, field)[i]
            v.status[i] = PASS
            v.reasons.pop(i, None)
        elif again.status[i] == FAIL and not moved:
            confirmed += 1
        elif again.causes.get(i) == verdict.INACCURATE and abs(again.numeric[i] - v.numeric[i]) <= 2 * v.fd_error[i]:
            # Noisier at the smaller step (its roundoff is the pessimistic bound), yet reading what
            # step h read to within h's own error: a jump or a saturation would have moved it.
            confirmed += 1
        else:
            v.status[i] = INCONCLUSIVE
            v.causes[i] = verdict.KINK
            v.reasons[i] = (f"the discrepancy does not persist at a smaller step: finite differences give "
                            f"{v.numeric[i]:.6g} at step h and {again.numeric[i]:.6g} at h/{1 / scale:.3g} "
                            f"(a jump, pole or steep feature within the step)")
    return confirmed


def _above_rounding(probe: "XProbe", a: np.ndarray, v: verdict.Verdicts, fails: np.ndarray) -> np.ndarray:
    """The failing items whose discrepancy the network could have shown: over a step h, the
    values y is computed from change in steps of their ulp, so a quotient resolves nothing finer
    than ulp / h (an erf at 16 has slope 1e-110 and an output that moves by none of it). Items
    below that are inconclusive; the rest are returned."""
    magnitude = probe.downstream_magnitude()
    if not magnitude or not np.isfinite(magnitude):
        return fails
    grain = ROUNDING_ULPS * float(np.spacing(magnitude)) / probe.pert.step.reshape(-1)[fails]
    below = v.abs_err[fails] <= grain
    for i, g in zip(fails[below].tolist(), grain[below].tolist()):
        v.status[i] = INCONCLUSIVE
        v.causes[i] = verdict.INACCURATE
        v.reasons[i] = (f"analytic {a[i]:.6g} vs numeric {v.numeric[i]:.6g}: a difference below what the network "
                        f"can show over the step ({g:.3g}: the ulp of the values downstream, up to "
                        f"{magnitude:.3g}, over h), so no failure")
    return fails[~below]


def confirm_directions(probe: "XProbe", grad: torch.Tensor, v: verdict.Verdicts) -> None:
    """A failing direction is re-measured along two nearby directions before it counts.

    Along one line through a point where several coordinates sit on kinks (Relu inputs at
    exactly 0), the kinks' one-sided jumps can cancel: the line looks smooth, yet <g, u> is
    not its slope because no gradient exists there. Rescaling each coordinate of u at random
    breaks the cancellation, so a one-sided gap along u * s exposes the kink.
    """
    fails = np.nonzero(v.status == FAIL)[0]
    if len(fails) == 0 or probe.control.stopped == "cancelled":
        return
    base = probe.directions[torch.as_tensor(fails)].repeat_interleave(2, dim=0)
    rng = np.random.default_rng([probe.opts.seed, 11])
    scale = torch.from_numpy(0.5 + rng.random(tuple(base.shape))).to(base)
    dirs = base * scale
    pert = fd.direction_perturbations(probe.x, dirs)
    probe.control.plan(2 * pert.count)
    # At the step the failure was measured at: a larger one where the network rounds small ones away.
    scale = float(max(1.0, probe.m.ladder[fails].max()))
    laddered = scale > 1  # with its own roundoff probes, and h/2 to tell curvature from a kink
    m = fd.measure(probe.objective, probe.x, pert, torch.arange(pert.count), probe.opts.chunk, probe.control,
                   "confirming", scale=scale, noise_l=None if laddered else probe.noise_l,
                   probes=min(fd.PROBES, pert.count) if laddered else 0)
    if laddered:
        fd.refine(probe.objective, probe.x, pert, m, np.arange(pert.count), probe.opts.chunk, probe.control, "confirming")
    a, _ = fd.direction_items(grad.detach().to(torch.float64), dirs)
    kinks = verdict.one_sided_gaps(a, m, verdict.tolerance(len(a), probe.opts.rtol, probe.opts.atol, a, m.noise,
                                                           slopes=True))
    for j, item in enumerate(fails):
        pair = slice(2 * j, 2 * j + 2)
        if kinks[pair].any():
            k = 2 * j + int(np.argmax(kinks[pair]))
            v.status[item] = INCONCLUSIVE
            v.reasons[item] = (f"not differentiable here: along a nearby direction the one-sided derivatives "
                               f"{m.fminus1[k]:.6g} (left) and {m.fplus1[k]:.6g} (right) disagree (kinks whose "
                               "jumps cancel along the direction itself)")


def coarse(v: verdict.Verdicts, m: fd.Measurement, truncation: bool) -> list[int]:
    """Inconclusive items another step may settle: with `truncation`, kinks and the coarse ones whose
    error is the two steps' disagreement (smaller steps help); else the coarse ones whose error is
    roundoff (larger steps help)."""
    out = []
    for i, cause in v.causes.items():
        if cause == verdict.KINK:
            if truncation:
                out.append(i)
        elif cause in (verdict.UNRESOLVED, verdict.INACCURATE):
            steps_differ = bool(m.refined[i]) and abs(m.d1[i] - m.d2[i]) > 2 * m.noise[i]
            if steps_differ == truncation:
                out.append(i)
    return out
