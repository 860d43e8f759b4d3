"""A compact float64 finite-difference gradient check used by the conformance sweep.

`fd_check(model, y, xs, zs, feeds) -> GradCheck` is the interface the sweep calls; when the
verifier (`engine.check`) is available the sweep goes through it instead (see `checker()`).

Method: the scalar L = <dy, y> with random dy; for each checked element (all of a small x,
seeded samples plus random directions of a large one) central differences at h and h/2 combined
by Richardson extrapolation, whose difference is the error estimate. One-sided differences that
disagree mark a kink: there an analytic value between them is inconclusive, not failed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

PASS, FAIL, INCONCLUSIVE, NONFINITE = "pass", "fail", "inconclusive", "non-finite"
_RANK = {PASS: 0, INCONCLUSIVE: 1, NONFINITE: 2, FAIL: 3}


@dataclass(frozen=True)
class GradCheck:
    """One (y, xs) check: the worst element's verdict and where it is."""

    status: str
    reason: str = ""
    worst: str = ""  # "x[1, 2]: analytic …, numeric …"
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    evaluations: int = 0  # forward passes spent on finite differences


def worse(a: str, b: str) -> str:
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


def fd_check(model, y: str, xs: Sequence[str], zs: Sequence[str], feeds: Mapping[str, np.ndarray], *,
             dy: np.ndarray | None = None, seed: int = 0, full_limit: int = 64, samples: int = 12,
             directions: int = 3, rtol: float = 1e-4, atol: float = 1e-6) -> GradCheck:
    f64 = torch.float64
    cpu = torch.device("cpu")
    names = list(xs) + list(zs)
    values = [model.to_tensor(n, feeds[n], cpu, f64) for n in names]
    plan = model.prepare(names, [y], device=cpu, dtype=f64)
    with torch.no_grad():
        y0 = plan.run(values)[0]
    if not y0.is_floating_point():
        return GradCheck(PASS, "y is not a float tensor")
    gen = np.random.default_rng(seed)
    if dy is None:
        dy = gen.standard_normal(tuple(y0.shape))
    dy_t = torch.as_tensor(np.asarray(dy, dtype=np.float64))
    dy_t = torch.where(torch.isfinite(y0), dy_t, torch.zeros_like(dy_t))  # a non-finite y would poison L
    prepared = model.prepare_gradient(y, xs, zs, device=cpu, dtype=f64)
    grads = prepared(*values, dy=dy_t).grads
    n_xs = len(xs)

    def loss(k: int, x_k: torch.Tensor) -> float:
        vals = list(values)
        vals[k] = x_k
        with torch.no_grad():
            out = plan.run(vals)[0]
        return float(torch.where(torch.isfinite(y0), out * dy_t, torch.zeros_like(out)).sum())

    f0 = float(torch.where(torch.isfinite(y0), y0 * dy_t, torch.zeros_like(y0)).sum())
    result = GradCheck(PASS)
    evaluations = 0
    for k in range(n_xs):
        x, g = values[k], grads[k].to(f64)
        if not torch.isfinite(g).all():
            bad = tuple(int(i) for i in torch.nonzero(~torch.isfinite(g))[0])
            result = _merge(result, GradCheck(NONFINITE, f"analytic d{y}/d{xs[k]} is non-finite at {bad}",
                                              f"{xs[k]}{list(bad)}"))
            continue
        probes = _probes(x, full_limit, samples, directions, gen)
        for label, u in probes:
            a = float((g * u).sum())
            scale = max(1.0, float((x.abs() * u.abs()).max()))
            h = 1e-4 * scale
            fp, fm = loss(k, x + h * u), loss(k, x - h * u)
            fp2, fm2 = loss(k, x + 0.5 * h * u), loss(k, x - 0.5 * h * u)
            evaluations += 4
            verdict = _judge(a, f0, fp, fm, fp2, fm2, h, rtol, atol)
            if verdict.status != PASS:
                verdict = GradCheck(verdict.status, verdict.reason,
                                    f"{xs[k]}{label}: analytic {a:.6g}, numeric {verdict.worst}",
                                    verdict.max_abs_err, verdict.max_rel_err)
            result = _merge(result, verdict)
    return GradCheck(result.status, result.reason, result.worst, result.max_abs_err, result.max_rel_err, evaluations)


def _probes(x: torch.Tensor, full_limit: int, samples: int, directions: int, gen) -> list:
    n = x.numel()
    out = []

    def unit(i: int) -> torch.Tensor:
        u = torch.zeros(n, dtype=torch.float64)
        u[i] = 1.0
        return u.reshape(x.shape)

    if n <= full_limit:
        idx = range(n)
    else:
        idx = sorted(gen.choice(n, size=samples, replace=False).tolist())
    for i in idx:
        out.append((list(np.unravel_index(i, tuple(x.shape))) if x.dim() else [], unit(i)))
    if n > full_limit:
        for d in range(directions):
            u = torch.as_tensor(gen.standard_normal(tuple(x.shape)))
            out.append((f"·u{d}", u / u.norm()))
    return [(str([int(v) for v in lab]) if isinstance(lab, list) else lab, u) for lab, u in out]


def _judge(a, f0, fp, fm, fp2, fm2, h, rtol, atol) -> GradCheck:
    d1 = (fp - fm) / (2 * h)
    d2 = (fp2 - fm2) / h
    numeric = (4 * d2 - d1) / 3
    estimate = abs(d2 - d1)
    if not all(math.isfinite(v) for v in (numeric, a)):
        return GradCheck(NONFINITE, "finite differences are non-finite", f"{numeric:.6g}")
    roundoff = 1e-13 * (abs(f0) + 1.0) / h
    err = abs(a - numeric)
    rel = err / max(abs(a), abs(numeric), 1e-300)
    tol = atol + rtol * max(abs(a), abs(numeric)) + roundoff
    if err <= tol:
        return GradCheck(PASS, max_abs_err=err, max_rel_err=rel)
    # One-sided slopes at h/2 and h. Smooth: their gap grows linearly with the step; a kink
    # keeps a constant gap (or appears only at the larger step when it lies between h/2 and h).
    right2, left2 = (fp2 - f0) / (0.5 * h), (f0 - fm2) / (0.5 * h)
    right1, left1 = (fp - f0) / h, (f0 - fm) / h
    gap1, gap2 = right1 - left1, right2 - left2
    if abs(gap1 - 2 * gap2) > max(tol, 0.1 * abs(gap1)):
        slopes = (right2, left2, right1, left1)
        lo, hi = min(slopes), max(slopes)
        where = f"one-sided derivatives {left2:.6g} (left) and {right2:.6g} (right)"
        if lo - tol <= a <= hi + tol:
            return GradCheck(INCONCLUSIVE, f"kink: {where}", f"{numeric:.6g}", err, rel)
        return GradCheck(FAIL, f"kink, and the analytic value is outside the one-sided range [{lo:.6g}, {hi:.6g}]",
                         f"{numeric:.6g}", err, rel)
    if err <= 3 * estimate:
        return GradCheck(INCONCLUSIVE, f"finite-difference error estimate {estimate:.3g} exceeds the tolerance",
                         f"{numeric:.6g}", err, rel)
    return GradCheck(FAIL, f"|analytic - numeric| {err:.3g} > tolerance {tol:.3g}", f"{numeric:.6g}", err, rel)


def _merge(acc: GradCheck, new: GradCheck) -> GradCheck:
    if _RANK[new.status] > _RANK[acc.status] or (
            new.status == acc.status and new.max_abs_err > acc.max_abs_err and new.status != PASS):
        return GradCheck(new.status, new.reason, new.worst, max(acc.max_abs_err, new.max_abs_err),
                         max(acc.max_rel_err, new.max_rel_err))
    return GradCheck(acc.status, acc.reason, acc.worst, max(acc.max_abs_err, new.max_abs_err),
                     max(acc.max_rel_err, new.max_rel_err))
