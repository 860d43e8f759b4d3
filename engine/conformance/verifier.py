"""The sweep's checker on top of the verifier (`engine.verify.check`), same interface as `fd.fd_check`.

How much is checked (so the sweep fits a CI budget): every element of an x with at most
`full_limit` elements; otherwise `samples` seeded random elements plus `directions` seeded random
directions (the verifier's sample and fast modes). dy is random (seeded) for a non-scalar y.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .fd import FAIL, INCONCLUSIVE, NONFINITE, PASS, GradCheck, worse

FULL_LIMIT = 64
SAMPLES = 16
DIRECTIONS = 4


def available() -> bool:
    try:
        from ..verify import check  # noqa: F401
    except ImportError:
        return False
    return True


def default_checker():
    """(name, checker): the verifier when it is importable, else the sweep's own finite differences."""
    if available():
        return "engine.verify.check", verifier_check
    from .fd import fd_check

    return "engine.conformance.fd", fd_check


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
    status, reason, worst, abs_err, rel_err, forwards = PASS, "", "", 0.0, 0.0, 0
    for report in runs:
        for r in report.results:
            forwards += r.forwards
            abs_err = max(abs_err, r.max_abs_err or 0.0)
            rel_err = max(rel_err, r.max_rel_err or 0.0)
            s = {"pass": PASS, "fail": FAIL}.get(r.status, INCONCLUSIVE)
            if s != PASS and worse(s, status) != status:
                status, reason = s, f"x {r.name!r}: {r.reason or r.status}"
        if report.first_failing_node:
            reason += f"; first failing node {report.first_failing_node}"
        for f in report.findings:
            if f.kind.startswith("nonfinite") and f.kind != "nonfinite-native" and status != FAIL:
                status, reason = NONFINITE, f.message
    return GradCheck(status, reason, worst, abs_err, rel_err, forwards)
