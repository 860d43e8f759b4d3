"""Per-item verdicts from analytic values and finite-difference measurements.

An item passes only when the comparison resolved it: |a - n| is within tolerance, *and* both the
automatic allowance and the finite differences' own error estimate are small (RESOLVED_REL)
against the quantity compared (the x's gradient scale for elements, the slope |<g, u>| itself for
a direction: never sum |g * u|, whose terms cancel in the slope). An item fails only when
|a - n| > atol and |a - n| / max(|a|, |n|) > rtol, *and* the discrepancy is beyond the finite
differences' own error estimate (xcheck.py then asks that it persist at smaller steps). Anything
else is inconclusive, with its cause. Items near a non-differentiable point are inconclusive,
never failed:
- one-sided derivatives disagree, and the gap does not shrink when the step halves (a kink at x:
  Relu or Abs at 0, a Max/Min tie, a Clip bound); a smooth function's gap halves with the step;
- central differences at h and h/2 disagree (the 5-point fit breaks: a kink or jump within h).
Refinement at h/2 is spent on the items that are not a clear pass: the doubtful ones, and the
failures (worst first, capped), since kinks crossed on both sides can fake a clean failure.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .fd import Measurement
from .status import FAIL, INCONCLUSIVE, PASS, UNCHECKED

RTOL = 1e-4  # float64 analytic vs float64 finite differences
ATOL_REL = 1e-6  # default atol, relative to the gradient's scale (so the check is scale-free)
KINK_REL = 1e-3  # a one-sided gap below this fraction of the scale cannot change a verdict
RESOLUTION_REL = 1e-3  # default atol may rise to the finite differences' roundoff, up to this fraction of the scale
# A pass needs the finite differences' error and the automatic allowance under this fraction of the
# quantity compared: then a pass bounds |a - true| by a few thousandths of it, whatever cancels.
RESOLVED_REL = 1e-3
UNCONVERGED = 0.25  # central differences at h and h/2 this far apart (relatively) have not converged
MAX_REFINED_FAILS = 256
# Why an item is inconclusive, for deciding whether another step size could settle it.
KINK, INACCURATE, UNREFINED, UNDEFINED = "kink", "inaccurate", "unrefined", "undefined"
UNRESOLVED = "unresolved"  # agrees within tolerance, but the comparison is too coarse to mean it


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: np.ndarray  # per item, absolute
    scale: float  # the gradient scale the defaults were derived from
    # Per item, the size of the quantity compared (elements: the x's gradient scale); None: each
    # item's own max(|a|, |n|) (directions, whose slope is the quantity).
    quantity: np.ndarray | None = None
    explicit: bool = False  # rtol or atol given by the caller: their allowance counts as resolution


def element_scale(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """The largest magnitude both sides agree exists: robust to a jump's huge quotient and to a zero VJP."""
    ok = np.isfinite(analytic) & np.isfinite(numeric)
    if not ok.any():
        return 0.0
    return float(np.max(np.minimum(np.abs(analytic[ok]), np.abs(numeric[ok]))))


def tolerance(n: int, rtol: float | None, atol: float | None, scale: np.ndarray | float,
              noise: np.ndarray | None = None, slopes: bool = False) -> Tolerance:
    """Elements: `scale` is the x's gradient scale. The default atol is ATOL_REL times it, raised to
    the finite differences' own resolution (their roundoff) as long as that stays below
    RESOLUTION_REL of the scale: an element far smaller than the rest of its gradient cannot be
    resolved and cannot matter. Directions (`slopes`): `scale` holds each item's analytic slope,
    and atol is ATOL_REL of it, never raised: the roundoff of a direction grows with sum |g * u|,
    which its slope <g, u> can be a small remainder of."""
    # Plain numpy on arrays of a few items: nan_to_num and broadcast_to cost more than the arithmetic.
    scale_arr = np.full(n, float(scale)) if np.ndim(scale) == 0 else np.abs(np.asarray(scale, dtype=np.float64))
    top = float(np.max(scale_arr, initial=0.0)) if n else 0.0
    quantity = None if slopes else scale_arr
    if atol is None:
        atol_arr = ATOL_REL * scale_arr
        if noise is not None and not slopes:
            # A gradient that is zero up to roundoff (every element below what finite differences
            # resolve) has no scale of its own: the resolution stands in for it in atol, so that
            # -5e-16 against 0 is no failure; the quantity compared stays the gradient's own, so
            # neither is it a pass (it is resolved, if at all, node by node).
            resolution = _finite_or_zero(noise)
            atol_arr = np.maximum(ATOL_REL * np.maximum(scale_arr, resolution),
                                  np.minimum(resolution, RESOLUTION_REL * np.maximum(scale_arr, resolution)))
    else:
        atol_arr = np.full(n, float(atol))
    return Tolerance(RTOL if rtol is None else float(rtol), np.array(atol_arr, dtype=np.float64), max(top, 0.0),
                     quantity, explicit=rtol is not None or atol is not None)


def _finite_or_zero(a: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(a), a, 0.0)


def widened(tol: Tolerance, slack: np.ndarray) -> Tolerance:
    """`tol` with atol raised to `slack` per item (the analytic side's own rounding error)."""
    return dataclasses.replace(tol, atol=np.maximum(tol.atol, _finite_or_zero(slack)))


def _threshold(a, n, tol: Tolerance):
    return np.maximum(tol.atol, tol.rtol * np.maximum(np.abs(a), np.abs(n)))


def resolved(a: np.ndarray, numeric: np.ndarray, fd_err: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Items whose comparison means something: the finite differences' error and the automatic
    allowance are both under RESOLVED_REL of the quantity compared. A tolerance the caller chose
    counts as enough resolution (their atol says what they accept). So does an exact zero on both
    sides where the gradient itself is zero (an element; every direction): L(x + h) == L(x - h) to
    the bit, and no wrong VJP of a zero gradient differs from it. A direction whose slope is exactly
    zero while the gradient is not (a softmax's shift) is blind, not resolved."""
    with np.errstate(invalid="ignore"):
        quantity = tol.quantity if tol.quantity is not None else np.maximum(np.abs(a), np.abs(numeric))
        limit = RESOLVED_REL * quantity
        if tol.explicit:
            limit = np.maximum(limit, _threshold(a, numeric, tol))
        exact = (a == 0) & (numeric == 0)
        if tol.quantity is None and tol.scale > 0:
            exact = np.zeros_like(exact)
        return exact | ((fd_err <= limit) & (tol.atol <= limit))


def _first_pass(a: np.ndarray, m: Measurement, tol: Tolerance):
    """(threshold, clear pass, clear fail) from the step-h quotients alone.

    A clear fail needs the one-sided quotients to agree with each other far better than with the
    analytic value: then nothing non-smooth lies within h and the discrepancy is real.
    """
    with np.errstate(invalid="ignore"):
        thr = _threshold(a, m.d1, tol)
        diff = np.abs(a - m.d1)
        gap = np.abs(m.fplus1 - m.fminus1)
        gap_thr = np.maximum(np.maximum(thr, 4 * m.noise), KINK_REL * tol.scale)
        clear_pass = (diff <= 0.5 * thr) & (gap <= gap_thr) & resolved(a, m.d1, m.noise, tol)
        clear_fail = (diff > 4 * thr) & (diff > 8 * m.noise) & (gap <= 0.5 * diff)
    return thr, diff, clear_pass, clear_fail


def all_clear(a: np.ndarray, m: Measurement, tol: Tolerance) -> Verdicts | None:
    """The verdicts when every item was evaluated and is a clear pass at step h, else None.

    The common case, and what `classify` would conclude for it (nothing to refine, retry or
    explain), without its per-cause bookkeeping: a fast check of a small model is a few
    milliseconds, and that bookkeeping would be a tenth of it.
    """
    if not m.evaluated.all() or (m.reshaped is not None and m.reshaped.any()):
        return None
    thr, diff, clear_pass, _ = _first_pass(a, m, tol)
    if not (clear_pass.all() and np.isfinite(a).all()):
        return None
    if m.refined.any():
        # Measured at h/2 as well (a judge again after the larger steps of absorbed.py): reported
        # as classify reports them, by Richardson's estimate and the gap between the two steps.
        # The step-h quotient alone can be 14% off (at 32,768 h), with its roundoff (6e-8) as the error.
        v = classify(a, m, tol)
        return v if (v.status == PASS).all() else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = diff / np.maximum(np.maximum(np.abs(a), np.abs(m.d1)), 1e-300)
        ratio = diff / np.maximum(thr, 1e-300)
    status = np.full(len(a), PASS, dtype=object)
    return Verdicts(status, m.d1.copy(), m.noise.copy(), diff, rel, ratio, tol.atol, {}, {}, signal(a, m.d1, tol))


def doubtful(a: np.ndarray, m: Measurement, tol: Tolerance) -> np.ndarray:
    """Items the step-h quotients leave undecided: neither a clear pass nor a clear fail."""
    ev = m.evaluated & np.isfinite(a) & np.isfinite(m.d1)
    _, _, clear_pass, clear_fail = _first_pass(a, m, tol)
    return np.nonzero(ev & ~clear_pass & ~clear_fail)[0]


def one_sided_gaps(a: np.ndarray, m: Measurement, tol: Tolerance) -> np.ndarray:
    """Items whose one-sided quotients at step h disagree beyond what curvature or noise explain;
    where refined, also at h/2 without the gap halving (curvature's gap halves with the step, and
    at the larger steps of absorbed.py it is no longer small)."""
    with np.errstate(invalid="ignore"):
        thr = _threshold(a, m.d1, tol)
        gap = np.abs(m.fplus1 - m.fminus1)
        g2 = np.abs(m.fplus2 - m.fminus2)
        halves = m.refined & ~((g2 > np.maximum(thr, 8 * m.noise)) & (g2 > 0.75 * gap))
        return m.evaluated & (gap > np.maximum(thr, 4 * m.noise)) & ~halves


def to_refine(a: np.ndarray, m: Measurement, tol: Tolerance, worst_too: bool = True) -> np.ndarray:
    """Items whose first-pass verdict is in doubt, plus the worst item (so that it carries a Richardson
    error estimate) unless `worst_too` is off and it is a clear pass."""
    ev = m.evaluated & np.isfinite(a) & np.isfinite(m.d1)
    thr, diff, clear_pass, clear_fail = _first_pass(a, m, tol)
    picks = set(np.nonzero(ev & ~clear_pass & ~clear_fail)[0].tolist())
    # Clear fails are refined too, worst first and up to a cap: kinks crossed on both sides of the
    # point can cancel in the one-sided quotients, and only the h/2 step exposes them.
    fails = np.nonzero(ev & clear_fail)[0]
    if len(fails):
        worst_first = fails[np.argsort(-(diff[fails] / np.maximum(thr[fails], 1e-300)))]
        picks.update(worst_first[:MAX_REFINED_FAILS].tolist())
    if ev.any():
        ratio = np.where(ev, diff / np.maximum(thr, 1e-300), -1.0)
        worst = int(np.argmax(ratio))
        if worst_too or not clear_pass[worst]:
            picks.add(worst)
    return np.array(sorted(picks), dtype=np.int64)


@dataclass(frozen=True)
class Verdicts:
    status: np.ndarray  # object array: pass / fail / inconclusive / unchecked
    numeric: np.ndarray  # best estimate per item
    fd_error: np.ndarray
    abs_err: np.ndarray
    rel_err: np.ndarray
    ratio: np.ndarray  # abs_err / threshold: > 1 is out of tolerance
    atol: np.ndarray
    reasons: dict  # item -> reason, for non-pass items
    causes: dict  # item -> KINK / INACCURATE / UNREFINED / UNDEFINED / UNRESOLVED, for inconclusive items
    signal: np.ndarray | None = None  # per item, the size of the quantity compared


def classify(a: np.ndarray, m: Measurement, tol: Tolerance) -> Verdicts:
    e = _estimates(a, m, tol)
    r = m.refined
    ev = m.evaluated
    nonfinite_fd = ev & ~np.isfinite(m.d1)
    nonfinite_a = ev & np.isfinite(m.d1) & ~np.isfinite(a)
    finite = ev & ~nonfinite_fd & ~nonfinite_a
    _, _, clear_pass, clear_fail = _first_pass(a, m, tol)
    # Masks first, Python only for the few items that need a reason (a loop over every item costs
    # more than the finite differences of a small model).
    with np.errstate(invalid="ignore"):
        ref_kink = finite & r & e.kink
        within = finite & r & ~e.kink & (e.diff <= e.thr)
        ref_pass = within & resolved(a, e.numeric, e.fd_err, tol)
        ref_unresolved = within & ~ref_pass
        ref_inaccurate = finite & r & ~e.kink & ~within & (e.diff <= e.fd_err)
        ref_fail = finite & r & ~e.kink & ~within & ~ref_inaccurate
    first_pass = finite & ~r
    status = np.full(len(a), UNCHECKED, dtype=object)
    status[ref_pass | (first_pass & clear_pass)] = PASS
    status[ref_fail | (first_pass & ~clear_pass & clear_fail)] = FAIL
    unrefined = first_pass & ~clear_pass & ~clear_fail
    status[ref_kink | ref_inaccurate | ref_unresolved | unrefined] = INCONCLUSIVE
    quantity = signal(a, e.numeric, tol)
    reasons: dict[int, str] = {}
    causes: dict[int, str] = {}
    for mask, cause in ((ref_unresolved, UNRESOLVED), (ref_kink, KINK), (ref_inaccurate, INACCURATE),
                        (unrefined, UNREFINED)):
        for i in np.nonzero(mask)[0].tolist():
            reasons[i] = _inconclusive_reason(cause, i, e, m, quantity)
            causes[i] = cause
    _undefined(a, m, e.numeric, nonfinite_fd, nonfinite_a, status, reasons, causes)
    return Verdicts(status, e.numeric, e.fd_err, e.diff, e.rel, e.ratio, tol.atol, reasons, causes, quantity)


class _Estimates(NamedTuple):
    numeric: np.ndarray  # the best estimate per item
    fd_err: np.ndarray
    kink: np.ndarray  # a kink or jump shows (one_sided, or the two central differences disagree)
    one_sided: np.ndarray  # the one-sided gap does not halve with the step
    diff: np.ndarray  # |a - numeric|
    thr: np.ndarray  # the allowed |a - numeric|
    rel: np.ndarray
    ratio: np.ndarray  # diff / thr


def _estimates(a: np.ndarray, m: Measurement, tol: Tolerance) -> _Estimates:
    """Each item's best finite-difference estimate and its error, whether a kink shows, and how far
    the analytic value is from the estimate."""
    numeric = m.d1.copy()
    fd_err = m.noise.copy()
    r = m.refined
    noise2 = 2 * m.noise
    d1, d2 = m.d1, m.d2
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        thr1 = _threshold(a, d1, tol)
        g1 = m.fplus1 - m.fminus1
        g2 = m.fplus2 - m.fminus2
        # A gap that could move a verdict (beyond tolerance and noise) and that does not halve with
        # the step: smooth curvature halves it, a kink at x keeps it.
        one_sided = r & (np.abs(g2) > np.maximum(thr1, 4 * noise2)) & (np.abs(g2) > 0.75 * np.abs(g1))
        # Or the two central differences disagree: beyond tolerance, or (beyond noise) by a good part
        # of themselves, as a jump's J/2h against J/h does however small both are beside a.
        gap12 = np.abs(d1 - d2)
        steps = r & (gap12 > 4 * noise2) & ((gap12 > thr1) | (gap12 > UNCONVERGED * np.maximum(np.abs(d1), np.abs(d2))))
        kink = one_sided | steps
        smooth = r & ~kink
        # Richardson removes the h^2 term but amplifies roundoff 1.7x: worth it only when the two
        # steps differ by more than their noise; otherwise the larger step's quotient is the better.
        # On the larger steps of absorbed.py truncation may be the error to remove, whatever the noise.
        forced = m.richardson if m.richardson is not None else False
        extrapolate = smooth & ((np.abs(d1 - d2) > 2 * (m.noise + noise2)) | forced)
        numeric[extrapolate] = (4 * d2[extrapolate] - d1[extrapolate]) / 3
        numeric[kink] = d2[kink]
        fd_err[r] = np.abs(d1[r] - d2[r]) + noise2[r]
        diff = np.abs(a - numeric)
        thr = _threshold(a, numeric, tol)
        rel = diff / np.maximum(np.maximum(np.abs(a), np.abs(numeric)), 1e-300)
        ratio = diff / np.maximum(thr, 1e-300)
    return _Estimates(numeric, fd_err, kink, one_sided, diff, thr, rel, ratio)


def _inconclusive_reason(cause: str, i: int, e: _Estimates, m: Measurement, quantity: np.ndarray) -> str:
    if cause == UNRESOLVED:
        return unresolved_reason(e.fd_err[i], e.thr[i], quantity[i])
    if cause == KINK:
        return _kink_reason(e.one_sided[i], m, i)
    if cause == INACCURATE:
        return (f"finite differences are not accurate enough here: their error estimate "
                f"{e.fd_err[i]:.3g} exceeds the discrepancy {e.diff[i]:.3g}")
    return "needed a refinement step that was not run (stopped early)"


def _undefined(a: np.ndarray, m: Measurement, numeric: np.ndarray, nonfinite_fd: np.ndarray,
               nonfinite_a: np.ndarray, status: np.ndarray, reasons: dict, causes: dict) -> None:
    """Items where a derivative is undefined or the analytic value is not finite: NaN/Inf near the
    point or a shape that changes under perturbation (inconclusive); a NaN/Inf gradient (a failure)."""
    for i in np.nonzero(nonfinite_fd)[0].tolist():
        status[i] = INCONCLUSIVE
        reasons[i] = "the model's value is NaN or Inf near this point, so finite differences are undefined"
        causes[i] = UNDEFINED
    if m.reshaped is not None:
        for i in np.nonzero(m.evaluated & m.reshaped)[0].tolist():
            status[i] = INCONCLUSIVE
            reasons[i] = "the output shape changes under perturbation (a step in the function)"
            causes[i] = UNDEFINED
    for i in np.nonzero(nonfinite_a & ~(m.reshaped if m.reshaped is not None else False))[0].tolist():
        status[i] = FAIL
        reasons[i] = f"the analytic gradient is {a[i]} where finite differences give {numeric[i]:.6g}"


def signal(a: np.ndarray, numeric: np.ndarray, tol: Tolerance) -> np.ndarray:
    """The size of the quantity each item compares (what `resolved` measures the errors against)."""
    if tol.quantity is not None:
        return tol.quantity
    with np.errstate(invalid="ignore"):
        return np.maximum(np.abs(a), np.abs(numeric))


def unresolved_reason(fd_err: float, allowed: float, quantity: float) -> str:
    what = "the finite differences' error estimate" if fd_err > RESOLVED_REL * quantity else "the allowance"
    size = fd_err if fd_err > RESOLVED_REL * quantity else allowed
    return (f"agrees within tolerance, but {what} ({size:.3g}) is not small against the value compared "
            f"({quantity:.3g}): the comparison does not resolve the gradient")


def _kink_reason(one_sided: bool, m: Measurement, i: int) -> str:
    if one_sided:
        return (f"not differentiable here: one-sided derivatives {m.fminus2[i]:.6g} (left) and "
                f"{m.fplus2[i]:.6g} (right) disagree, also at half the step (a kink such as Relu/Abs at 0, "
                "a Max/Min tie or a Clip bound)")
    return (f"a kink or jump lies within one step of this point: central differences at h and h/2 "
            f"give {m.d1[i]:.6g} and {m.d2[i]:.6g}")
