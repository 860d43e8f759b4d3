"""The sweeps' gradient checker: the verifier (`engine.verify.check`), its reports folded into one
`GradCheck` per (y, xs).

How much is checked (so the sweep fits a CI budget): every element of an x with at most
`full_limit` elements; otherwise `samples` seeded random elements plus `directions` seeded random
directions (the verifier's sample and fast modes). dy is random (seeded) for a non-scalar y.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .status import FAIL, INCONCLUSIVE, NONFINITE, PASS, SKIPPED, worse

FULL_LIMIT = 64
SAMPLES = 16
DIRECTIONS = 4


@dataclass(frozen=True)
class GradCheck:
    """One (y, xs) check: the worst verdict over xs and why."""

    status: str
    reason: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    evaluations: int = 0  # forward passes spent on finite differences


def default_checker():
    """(name, checker): the name is what reports record as the gradient checker."""
    return "engine.verify.check", verifier_check


def verifier_check(model, y: str, xs: Sequence[str], zs: Sequence[str], feeds: Mapping[str, np.ndarray], *,
                   seed: int = 0, full_limit: int = FULL_LIMIT, samples: int = SAMPLES,
                   directions: int = DIRECTIONS) -> GradCheck:
    from ..verify import check

    small = [x for x in xs if np.asarray(feeds[x]).size <= full_limit]
    large = [x for x in xs if x not in small]
    runs = []
    if small:
        runs.append(check(model, y, small, list(zs) + large, feeds, mode="full", seed=seed))
    if large:
        others = list(zs) + small
        runs.append(check(model, y, large, others, feeds, mode="sample", samples=samples, seed=seed))
        runs.append(check(model, y, large, others, feeds, mode="fast", directions=directions, seed=seed + 1))
    status, reason, abs_err, rel_err, forwards = PASS, "", 0.0, 0.0, 0
    for report in runs:
        for r in report.results:
            forwards += r.forwards
            abs_err = max(abs_err, r.max_abs_err or 0.0)
            rel_err = max(rel_err, r.max_rel_err or 0.0)
            s = r.status if r.status in (PASS, FAIL) else INCONCLUSIVE
            if s != PASS and worse(s, status) != status:
                status, reason = s, f"x {r.name!r}: {r.reason or r.status}"
        if report.first_failing_node:
            reason += f"; first failing node {report.first_failing_node}"
        for f in report.findings:
            if f.kind.startswith("nonfinite") and f.kind != "nonfinite-native" and status != FAIL:
                status, reason = NONFINITE, f.message
    return GradCheck(status, reason, abs_err, rel_err, forwards)


def native_check(model, y: str, xs: Sequence[str], zs: Sequence[str], feeds: Mapping[str, np.ndarray], *,
                 seed: int = 0) -> GradCheck:
    """The gradient in the model's own (half) dtype, as the verifier judges it: against float64
    through the values rounded to that dtype (verify/native.py), and in x's dtype. float64 finite
    differences along one direction come with it (the float32 cases check the formulas in full)."""
    from ..errors import OnnxGradError
    from ..verify import check

    report = check(model, y, list(xs), list(zs), feeds, mode="fast", directions=1, seed=seed)
    for f in report.findings:
        if f.kind == "native":
            raise OnnxGradError(f.message)
    overflow = next((f.message for f in report.findings if f.kind == "nonfinite-native"), "")
    status, reason, abs_err, rel_err = PASS, "", 0.0, 0.0
    for r in report.results:
        abs_err = max(abs_err, r.native_max_abs_err or 0.0)
        rel_err = max(rel_err, r.native_max_rel_err or 0.0)
        if r.native_status == FAIL and _at_a_kink(model, y, r.name, xs, zs, feeds, seed):
            found = INCONCLUSIVE, f"x {r.name!r}: at a kink, where float64 has no derivative for the native dtype to match"
        elif r.native_status == FAIL:
            found = FAIL, next(f.message for f in report.findings if f.kind == "native-precision" and f.x == r.name)
        elif r.status == FAIL:
            found = FAIL, f"x {r.name!r}: float64 {r.reason}"
        elif r.status not in (PASS, SKIPPED):
            found = INCONCLUSIVE, f"x {r.name!r}: float64 {r.reason or r.status}"
        else:
            continue
        if worse(found[0], status) != status:
            status, reason = found
    if overflow and status == PASS:
        status, reason = NONFINITE, overflow
    return GradCheck(status, reason, abs_err, rel_err, sum(r.forwards for r in report.results))


def _at_a_kink(model, y: str, x: str, xs, zs, feeds, seed: int) -> bool:
    """Whether float64 finite differences over every element of x find it at a kink (DeformConv's
    integer sampling positions): there the native dtype may legitimately take the other side."""
    from ..verify import check

    others = [n for n in xs if n != x] + list(zs)
    report = check(model, y, [x], others, feeds, mode="full", seed=seed)
    return any(r.status == INCONCLUSIVE and "kink" in r.reason for r in report.results)
