"""check(forward=True): the engine's forward mode checked twice per x, along a random tangent v.

- J·v against float64 central differences of y along v, element by element of y (tangent.py), by
  the same verdict rules as a gradient's elements;
- the transpose identity <u, J·v> = <Jᵀu, v>, forward mode against reverse mode, u random: the
  check's own dy when that is random (or y is a scalar), else a fresh one. Both sides are float64
  analytic values, so the allowance is their rounding error, not a finite-difference tolerance:
  the dot products' own (DOT_ROUNDOFF · eps · the sum of the absolute terms) and, when the
  identity is not met within that, a measured sample of each side's rounding (J·(3v)/3 against
  J·v, Jᵀ(3u)/3 against Jᵀu, as Context.analytic_roundoff does for the gradient) summed over the
  terms with ROUNDOFF_SAFETY. A pass needs the allowance small against the value compared; a
  failure, a discrepancy FAIL_FACTOR times beyond it (and beyond an explicit --rtol/--atol).

An op without a forward rule (ForwardModeError) leaves both inconclusive with its one-line reason.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import ForwardModeError
from .fd import EPS64, normal
from .report import TransposeCheck
from .resolve import advice
from .status import FAIL, INCONCLUSIVE, PASS
from .tangent import TangentProbe
from .verdict import RESOLVED_REL
from .xcheck import ROUNDOFF_SAFETY, skipped

DOT_ROUNDOFF = 16.0  # the rounding of a float64 dot product, in units of eps * sum |terms|
FAIL_FACTOR = 4.0  # a failure needs the discrepancy this far beyond the allowance
SALT = 7331  # the tangents' seeds: [seed, SALT, k]; u's: [seed, SALT + 1]
F64 = torch.float64


def tangent_for(ctx, k: int, seed: int) -> torch.Tensor:
    x = ctx.tensors64[ctx.sources.index(ctx.spec.xs[k])]
    return normal(x.shape, [seed, SALT, k], x)


def check_forward(ctx, opts, control) -> tuple[tuple, tuple]:
    """(J·v checks, transpose checks), one of each per x."""
    spec = ctx.spec
    try:
        prepared = ctx.model.prepare_jvp(spec.y, spec.xs, spec.zs, device=ctx.device, dtype=F64,
                                         extra_inputs=ctx.sources[len(spec.inputs):])
    except ForwardModeError as exc:
        return _refused(ctx, str(exc))
    u, grads = _cotangent(ctx, opts.seed)
    jvps, transposes = [], []
    for k, name in enumerate(spec.xs):
        x = ctx.tensors64[ctx.sources.index(name)]
        why = _not_checked(ctx, name, x, control)
        if why is not None:
            jvps.append(skipped(name, ctx.y0.shape, why[0], why[1]))
            transposes.append(_transpose_skipped(name, why[0], why[1]))
            continue
        v = tangent_for(ctx, k, opts.seed)
        try:
            jv = _jvp(ctx, prepared, k, v)
        except ForwardModeError as exc:
            return _refused(ctx, str(exc))
        probe = TangentProbe(name, ctx.x_function(name), x, ctx.y0, v, opts, control, stage="forward mode",
                             state=ctx.x_memo(name, x.shape).setdefault("batching", {}))
        r = probe.result(probe.judge(jv))
        if r.status == INCONCLUSIVE:
            r = _with_advice(r, probe, control)
        jvps.append(r)
        transposes.append(judge_transpose(ctx, prepared, k, v, jv, u, grads, opts))
    return tuple(jvps), tuple(transposes)


def _not_checked(ctx, name: str, x: torch.Tensor, control) -> tuple[str, str] | None:
    """(reason, status) when x's forward checks are not run; None when they are."""
    if name in ctx.disconnected:
        return f"y does not depend on {name!r}: J·v is zero", PASS
    if ctx.y0.numel() == 0 or x.numel() == 0:
        what = f"x {name!r}" if x.numel() == 0 else f"y {ctx.spec.y!r}"
        return f"skipped: empty ({what} has no elements)", PASS
    if control.halted():
        return f"not checked ({control.stopped})", INCONCLUSIVE
    return None


def _with_advice(r, probe, control):
    import dataclasses

    return dataclasses.replace(r, advice=advice(r, probe, control.stopped, True))


def _jvp(ctx, prepared, k: int, v: torch.Tensor) -> torch.Tensor:
    """J·v along v for the k-th x alone (zero tangents for the others)."""
    n = len(ctx.spec.xs)
    tangents = [v if j == k else torch.zeros_like(ctx.tensors64[j]) for j in range(n)]
    return prepared(*ctx.tensors64, tangents=tangents).jvp.detach()


def _cotangent(ctx, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(u, Jᵀu per x): the check's dy and its gradients when dy is random or y a scalar, else a
    random u and one more backward."""
    if ctx.dy_label == "scalar" or ctx.dy_label.startswith("random"):
        return ctx.dy, [ctx.grads64[n] for n in ctx.spec.xs]
    u = normal(ctx.y0.shape, [seed, SALT + 1], ctx.y0)
    return u, _backward(ctx, u)


def _backward(ctx, u: torch.Tensor) -> list[torch.Tensor]:
    return [g.detach() for g in ctx.gradient(*ctx.tensors64, dy=u).grads]


def judge_transpose(ctx, prepared, k: int, v: torch.Tensor, jv: torch.Tensor, u: torch.Tensor, grads,
                    opts) -> TransposeCheck:
    """<u, J·v> (forward) against <Jᵀu, v> (reverse) for the k-th x, by their rounding error."""
    name = ctx.spec.xs[k]
    g = grads[k].to(F64)
    lhs_terms, rhs_terms = (u * jv).reshape(-1), (g * v).reshape(-1)
    lhs, rhs = float(lhs_terms.sum()), float(rhs_terms.sum())
    terms = float(lhs_terms.abs().sum()) + float(rhs_terms.abs().sum())
    allowance = DOT_ROUNDOFF * EPS64 * terms
    diff, signal = abs(lhs - rhs), max(abs(lhs), abs(rhs))
    measured = ""
    if not diff <= allowance:  # also NaN: measure before judging
        sampled = _sampled_roundoff(ctx, prepared, k, v, jv, u, g)
        if sampled is None:
            measured = "J·(2v) or Jᵀ(2u) is not exactly twice J·v or Jᵀu (not linear): no rounding allowance"
        else:
            allowance += sampled
            measured = "measured"
    explicit = max(opts.atol or 0.0, (opts.rtol or 0.0) * signal)
    status, reason = _transpose_verdict(lhs, rhs, diff, signal, max(allowance, explicit))
    return TransposeCheck(name=name, status=status, forward=lhs, reverse=rhs, abs_err=diff,
                          rel_err=diff / signal if signal > 0 else (0.0 if diff == 0 else float("inf")),
                          error_estimate=allowance, signal=signal, roundoff=measured or "dot product",
                          reason=reason)


def _transpose_verdict(lhs: float, rhs: float, diff: float, signal: float, allowed: float) -> tuple[str, str]:
    if not (np.isfinite(lhs) and np.isfinite(rhs)):
        return FAIL, f"<u, J·v> = {lhs:.6g} and <Jᵀu, v> = {rhs:.6g}: not finite"
    if diff <= allowed:
        if allowed <= RESOLVED_REL * signal or diff == 0 and signal == 0 and allowed == 0:
            return PASS, ""
        return INCONCLUSIVE, (f"agrees within the rounding allowance {allowed:.3g}, but that is not small against "
                              f"the value compared ({signal:.3g}): the terms cancel")
    if diff > FAIL_FACTOR * allowed:
        return FAIL, (f"<u, J·v> = {lhs:.10g} (forward) but <Jᵀu, v> = {rhs:.10g} (reverse): |diff| {diff:.3g} > "
                      f"{FAIL_FACTOR:g} × the rounding allowance {allowed:.3g}")
    return INCONCLUSIVE, (f"|diff| {diff:.3g} is beyond the rounding allowance {allowed:.3g} but within "
                          f"{FAIL_FACTOR:g} times it")


def _sampled_roundoff(ctx, prepared, k: int, v, jv, u, g) -> float | None:
    """ROUNDOFF_SAFETY × (sum |u| |J·v − J·(3v)/3| + sum |v| |Jᵀu − Jᵀ(3u)/3|), or None when scaling
    by 2 (exact in floating point) does not reproduce either side bit for bit."""
    jv2, jv3 = (_jvp(ctx, prepared, k, c * v) for c in (2.0, 3.0))
    g2, g3 = (_backward(ctx, c * u)[k].to(F64) for c in (2.0, 3.0))
    if not (torch.equal(jv2 / 2, jv) and torch.equal(g2 / 2, g)):
        return None
    forward = float((u.abs() * (jv - jv3 / 3).abs()).sum())
    reverse = float((v.abs() * (g - g3 / 3).abs()).sum())
    return ROUNDOFF_SAFETY * (forward + reverse)


def _transpose_skipped(name: str, reason: str, status: str) -> TransposeCheck:
    return TransposeCheck(name=name, status=status, forward=None, reverse=None, abs_err=None, rel_err=None,
                          error_estimate=None, signal=None, roundoff="", reason=reason)


def _refused(ctx, why: str) -> tuple[tuple, tuple]:
    """Every x inconclusive: forward mode cannot go through the graph (an op without a forward rule)."""
    reason = f"forward mode not checked: {why}"
    return (tuple(skipped(n, ctx.y0.shape, reason, INCONCLUSIVE) for n in ctx.spec.xs),
            tuple(_transpose_skipped(n, reason, INCONCLUSIVE) for n in ctx.spec.xs))
