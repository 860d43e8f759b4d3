"""Perturbations the network rounds away: a step below the resolution of large values downstream.

SqueezeNet with its shipped constant weights has logits of 6.7e9, whose ulp is about 1e-6. A step
of 1e-6 on the last conv's bias moves them by about one ulp, so L(x ± h) reads L(x), or an ulp
off, and the quotient is 0 (or a multiple of ulp / h) where the gradient is 7e-4. The roundoff
probe, at a step 1000 times smaller, is rounded away as well: it measures no noise, and the
quotient looked exact. A zero gradient would have passed against that 0 just as well.

So where values downstream of x are large enough for this (the step is under ABSORB_ULPS ulps of
the largest of them), every item is measured again at larger steps (failures and items too noisy to
decide, and passes too: x + h itself rounds there, so the step taken is h give or take ulp / 2,
and a quotient that far off agrees with a 1% wrong gradient as readily as it disagrees with the
right one): a ladder that starts where the roundoff probe's own step reaches an ulp of the largest value, each rung with
fresh roundoff probes. A rung counts only when its probes register (a probe that reads exactly
L(x) while its quotient is not zero measures nothing), and the pass or fail verdicts it reaches are
adopted. A larger step measures the same derivative, with Richardson's h / 2 and the one-sided
quotients still guarding against curvature and kinks, so it cannot turn a wrong gradient into a
pass (a failure must hold on both the central and the extrapolated estimate, and agree with the
previous rung's); items that no rung settles are inconclusive, with the reason.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from . import fd, verdict
from .status import FAIL, INCONCLUSIVE, PASS

if TYPE_CHECKING:
    from .xcheck import XProbe

ABSORB_ULPS = 1e4  # a step that moves the largest value downstream by fewer ulps may be rounded away
LADDER = tuple(8.0 ** k for k in range(2, 8))  # 64 .. 2e6 times the step
MAX_VECTORS = 4096  # vectors per x measured on each rung
ABSORBED = "absorbed"


def largest(t: torch.Tensor) -> float:
    """The largest finite |value| of `t` (0 when empty)."""
    return float(torch.nan_to_num(t.abs(), nan=0.0, posinf=0.0).max()) if t.numel() else 0.0


def zero_readings(m: fd.Measurement) -> np.ndarray:
    """Items whose perturbed forwards both gave exactly L(x)."""
    with np.errstate(invalid="ignore"):
        return m.evaluated & (m.fplus1 == 0) & (m.fminus1 == 0)


def suspects(v: verdict.Verdicts) -> np.ndarray:
    """Items whose verdict a rounded-away step could have decided: fails, passes (see the module's
    note), and the inconclusive ones whose cause is the quotient (a quantized quotient also looks
    noisy, or like a kink when h / 2 reads another multiple of ulp / h)."""
    out = (v.status == FAIL) | (v.status == PASS)
    for i, cause in v.causes.items():
        if cause in (verdict.INACCURATE, verdict.KINK):
            out[i] = True
    return out


def settle(probe: "XProbe", a: np.ndarray, tolerance: Callable[..., verdict.Tolerance],
           v: verdict.Verdicts) -> dict | None:
    """Measures the suspects of an x whose steps the network may round away on the ladder, adopting
    into probe.m what a rung settles; None when nothing was suspect, else {item: reason} for the
    items no rung settled (see `marked`). `tolerance(m, strict)`: the tolerance with m's noise as
    the finite differences' resolution, or without it."""
    found = _ladder_items(probe, a, v)
    if found is None:
        return None
    items, magnitude, ulp = found
    steps = probe.pert.step.reshape(-1)
    probe.laddered = items
    # Inconclusive at h: a kink or noise there may be rounding, or a function that saturates within
    # h, which a larger step only makes worse (a quotient ~ 1/H, too small beside a large analytic
    # value for the kink test to notice). Those fail on a rung only where it measured a slope.
    doubtful = v.status == INCONCLUSIVE
    unsettled, widest, fallback, moved = _climb(probe, a, tolerance, items, doubtful, float(steps[items].min()), ulp)
    # The rest pass as ordinary items do when their discrepancy is under the resolution of the
    # finite differences at one of the rungs and a thousandth of the gradient's scale: elements
    # only, since a direction's scale sum |g * u| can dwarf its slope <g, u>, and that allowance
    # would then hide a wrong gradient.
    resolved = unsettled[fallback.evaluated[unsettled]]
    probe.m.take(fallback, resolved)
    unsettled = np.setdiff1d(unsettled, resolved)
    # Where no rung moved L either, y does not observably depend on x in float64 up to steps the
    # size of x (a softmax of equal logits, a dead unit): those items are judged as if the ladder
    # had not run, except failures while even the largest step may still be rounded away.
    flat = ~moved[unsettled] & ~((v.status[unsettled] == FAIL) & (widest < ABSORB_ULPS * ulp))
    probe.laddered = np.setdiff1d(items, unsettled[flat])
    unsettled = unsettled[~flat]
    return {i: (f"{v.reasons[i]}; larger steps up to {widest:.3g} did not settle it either (values "
                f"downstream reach {magnitude:.3g}, ulp {ulp:.3g})" if doubtful[i] else
                f"the network may round the perturbation away: values downstream reach {magnitude:.3g} "
                f"(ulp {ulp:.3g}), and steps from {steps[i]:.3g} up to {widest:.3g} did not resolve the "
                f"gradient here (analytic {a[i]:.6g}, numeric at the first step {v.numeric[i]:.6g})")
            for i in unsettled.tolist()}


def _ladder_items(probe: "XProbe", a: np.ndarray, v: verdict.Verdicts) -> tuple[np.ndarray, float, float] | None:
    """(items, magnitude, ulp): the suspects whose step is under ABSORB_ULPS ulps of the largest value
    downstream (magnitude), less the passes no rounding could have faked; None when there are none."""
    suspect = suspects(v)
    if not suspect.any():
        return None
    magnitude = probe.downstream_magnitude()
    if not magnitude or not np.isfinite(magnitude):
        return None
    ulp = float(np.spacing(magnitude))
    steps = probe.pert.step.reshape(-1)
    # A pass whose quotient is quantized (to about ulp / h by the values downstream) finer than the
    # tolerance is no rounded quotient agreeing by chance: a wrong gradient would read as wrong.
    with np.errstate(invalid="ignore"):
        fine = (v.status == PASS) & ~zero_readings(probe.m) & (ulp / steps <= verdict.RTOL * np.maximum(
            np.abs(a), np.abs(v.numeric)))
        # ... nor does one whose both values are a thousandth of the rest of its gradient or less: it
        # cannot matter, however its quotient was rounded (a gradient that is all zero has no rest).
        size = np.maximum(np.abs(a), np.abs(v.numeric))
        finite = size[np.isfinite(size)]
        top = float(finite.max()) if len(finite) else 0.0
        negligible = (v.status == PASS) & (size <= verdict.RESOLUTION_REL * top) & (top > 0)
    items = np.nonzero(suspect & ~fine & ~negligible & (steps < ABSORB_ULPS * ulp))[0]
    return (items, magnitude, ulp) if len(items) else None


def _climb(probe: "XProbe", a: np.ndarray, tolerance: Callable[..., verdict.Tolerance], items: np.ndarray,
           doubtful: np.ndarray, h: float, ulp: float):
    """(unsettled, widest step, fallback, moved): the rungs in turn, each adopting into probe.m what it
    decides; `fallback` holds the element passes a rung reached only at its own resolution, `moved`
    the items whose L some rung moved."""
    # From the first rung whose roundoff probe moves the largest value by an ulp (at unit sensitivity).
    rungs = [s for s in LADDER if s * h * fd.PROBE_SCALE >= ulp] or [LADDER[-1]]
    unsettled, widest = items, 0.0
    fallback = fd.Measurement.empty(len(a))
    before, before_err = np.full(len(a), np.nan), np.full(len(a), np.nan)
    moved = np.zeros(len(a), bool)
    for scale in rungs:
        if probe.control.halted():  # a time budget stops the ladder too: what is left is inconclusive
            break
        rung = _rung(probe, unsettled, scale)
        widest = scale * h
        if rung.saturated:
            continue
        moved |= rung.evaluated & ~zero_readings(rung)
        strict, decided = _adoptable(a, rung, tolerance(rung, strict=True), unsettled, doubtful, before, before_err,
                                     maybe_rounded=scale * h < ABSORB_ULPS * ulp)
        measured = rung.evaluated & np.isfinite(strict.numeric)
        before, before_err = np.where(measured, strict.numeric, before), np.where(measured, strict.fd_error, before_err)
        probe.m.take(rung, decided)
        unsettled = np.setdiff1d(unsettled, decided)
        if probe.pert.kind == "elements":
            lenient, resolved = _decide(a, rung, tolerance(rung), unsettled)
            resolved = resolved[lenient.status[resolved] == PASS]
            fallback.take(rung, resolved[~fallback.evaluated[resolved]])
        if len(unsettled) == 0:
            break
    return unsettled, widest, fallback, moved


def _rung(probe: "XProbe", unsettled: np.ndarray, scale: float) -> fd.Measurement:
    """The unsettled items' vectors (MAX_VECTORS at most) measured at scale times the step with fresh
    roundoff probes, and, unless the quotients saturated, refined at half of it."""
    vectors = np.unique(unsettled // probe.rows)[:MAX_VECTORS]
    k = min(fd.PROBES, len(vectors))
    probe.control.plan(4 * len(vectors) + 2 * k)
    rung = fd.measure(probe.objective, probe.x, probe.pert, torch.as_tensor(vectors), probe.opts.chunk,
                      probe.control, "absorbed steps", scale=scale, probes=k)
    if rung.saturated:
        return rung
    fd.refine(probe.objective, probe.x, probe.pert, rung, unsettled[np.isin(unsettled // probe.rows, vectors)],
              probe.opts.chunk, probe.control, "absorbed steps")
    rung.ladder[:] = scale
    return rung


def _adoptable(a: np.ndarray, rung: fd.Measurement, tol: verdict.Tolerance, unsettled: np.ndarray,
               doubtful: np.ndarray, before: np.ndarray, before_err: np.ndarray, maybe_rounded: bool):
    """(verdicts, the items to adopt): what the rung decides at the tolerance proper. A pass that
    needs atol raised to this rung's resolution waits for a larger step, which may resolve it better."""
    strict, decided = _decide(a, rung, tol, unsettled)
    unsound = doubtful & ~_slope(rung, strict)
    if maybe_rounded:  # a zero reading may still be rounding, not a flat function
        unsound |= zero_readings(rung)
    decided = decided[~((strict.status[decided] == FAIL) & unsound[decided])]
    # Far from h, quotients at H and H/2 can agree by coincidence: a verdict counts only where
    # the rung's estimate agrees with the previous rung's, within their error estimates.
    with np.errstate(invalid="ignore"):
        agree = ~(np.abs(strict.numeric - before) > strict.fd_error + before_err)
    return strict, decided[agree[decided]]


def _slope(rung: fd.Measurement, v: verdict.Verdicts) -> np.ndarray:
    """Items where the rung measured a slope: beyond its error estimate, and the same at H and H/2
    to a quarter of itself (a saturated quotient doubles when the step halves)."""
    with np.errstate(invalid="ignore"):
        return (np.abs(v.numeric) > v.fd_error) & (np.abs(rung.d1 - rung.d2) <= 0.25 * np.abs(rung.d2))


def _decide(a, rung: fd.Measurement, tol: verdict.Tolerance, items: np.ndarray):
    """(verdicts, the items decided) at a rung, judged on both estimates: the central quotient, and
    Richardson's extrapolation, whose noise is larger and whose truncation error is smaller (which
    wins depends on how far the step is from where the rounding stops). A pass on either counts,
    a failure only on both; rung.richardson records the estimate each item goes by."""
    rung.richardson[:] = True
    extrapolated = verdict.classify(a, rung, tol)
    rung.richardson[:] = False
    central = verdict.classify(a, rung, tol)
    use = (extrapolated.status == PASS) & (central.status != PASS)
    rung.richardson[:] = use
    v = verdict.classify(a, rung, tol)
    failed = (central.status == FAIL) & (extrapolated.status == FAIL)
    decided = (v.status == PASS) | failed
    return v, items[decided[items]]


def marked(v: verdict.Verdicts, marks: dict | None) -> verdict.Verdicts:
    """`v` with the items `settle` could not resolve made inconclusive, with its reasons."""
    for i, reason in (marks or {}).items():
        v.status[i] = INCONCLUSIVE
        v.reasons[i] = reason
        v.causes[i] = ABSORBED
    return v
