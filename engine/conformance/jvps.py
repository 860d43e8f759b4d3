"""The JVP sweep: forward mode (`Model.jvp`) on the node cases the gradient sweep checks, forward and transpose.

The same cases, xs, zs and ys as gradients.py (`selection_for`): for each y, J·v by the engine in
float64 along a seeded random v is compared element by element with float64 central differences
along v (at h and h/2: their gap is the differences' own error), then tied to reverse mode by the
transpose identity <u, J v> = <Jᵀu, v>, Jᵀu being the engine's gradient with dy = u (seeded).
Verdicts are the gradient sweep's (pass, inconclusive at a kink or where the differences cannot
resolve, fail, non-finite, error) plus `no forward rule`: the engine refused, naming the node
(ForwardModeError). The thresholds are the verifier's (engine/verify/verdict.py).
"""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import ForwardModeError, OnnxGradError
from ..verify.fd import PROBE_SAFETY, PROBE_SCALE, STEP
from ..verify.verdict import ATOL_REL, RESOLVED_REL, RTOL, UNCONVERGED, element_scale
from .cases import base_name, case_info
from .gradients import documented, op_gradient_status, selection_for
from .status import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    NO_FORWARD_RULE,
    NONFINITE,
    NOT_CHECKED,
    NOT_DIFFERENTIABLE,
    PASS,
    worse,
)

EPS64 = float(np.finfo(np.float64).eps)
ROUNDOFF = 16.0  # rounding error of a float64 output, in units of eps * |y| (fd.py's ROUNDOFF)
# The transpose identity holds exactly in real arithmetic; in float64 both sides carry the rounding of
# their own products, bounded by this many eps times sum |u * Jv| + sum |Jᵀu * v| (no cancellation
# inside the sums can hide a wrong term: a wrong entry of J moves one side by far more).
TRANSPOSE_EPS = 1e4


# Cases whose VJP check passes and JVP check may not (regex on the case name -> why), each an op
# forward mode refuses in one line instead of a silently zero tangent. None now: the ops torch's
# forward AD lacks or drops (GridSample, DeformConv, Scatter with reduction mul) take their J·v from
# their VJP (engine/forward/by_vjp.py); tests/jvp_floor.json records 0 such cases.
NO_RULE: dict[str, str] = {}


@dataclass(frozen=True)
class JVPOutcome:
    name: str
    op: str
    expanded: bool
    status: str
    reason: str = ""
    xs: tuple[str, ...] = ()
    ys: tuple[str, ...] = ()
    documented: str = ""  # why a fail / non-finite / error here is expected (gradients.DOCUMENTED)
    seconds: float = 0.0
    max_rel_err: float = 0.0  # max |Jv - fd| / scale over the ys (the forward comparison)
    transpose_residual: float = 0.0  # max |<u, Jv> - <Jᵀu, v>| / (sum |u Jv| + sum |Jᵀu v|) over the ys

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "expanded": self.expanded, "status": self.status,
                "reason": self.reason, "xs": list(self.xs), "ys": list(self.ys), "documented": self.documented,
                "seconds": round(self.seconds, 4), "max_rel_err": float(f"{self.max_rel_err:.3g}"),
                "transpose_residual": float(f"{self.transpose_residual:.3g}")}


@dataclass(frozen=True)
class YCheck:
    status: str
    reason: str = ""
    rel_err: float = 0.0
    residual: float = 0.0


def tangents_for(values: dict[str, np.ndarray], xs: Sequence[str], seed: int) -> dict[str, np.ndarray]:
    """Seeded standard normals scaled by max(1, |x|) per element: the verifier's relative step, so one
    step h = STEP along v moves each element as the gradient check moves it."""
    rng = np.random.default_rng((seed, 36))
    out = {}
    for x in xs:
        value = np.asarray(values[x], dtype=np.float64)
        out[x] = rng.standard_normal(value.shape) * np.maximum(1.0, np.abs(value))
    return out


def _along(values: dict, v: dict, t: float) -> dict:
    return {n: (a + t * v[n] if n in v else a) for n, a in values.items()}


def compare_jvp(a: np.ndarray, y0, plus, minus, plus2, minus2, h: float, tiny=None) -> tuple[str, str, float]:
    """(status, reason, max relative error) of J·v `a` against y at x ± h v and x ± h/2 v; `tiny`, y at
    x ± PROBE_SCALE·h v, measures the roundoff (fd.py's probes: at a step 1000 times smaller it dominates)."""
    d1, d2 = (plus - minus) / (2 * h), (plus2 - minus2) / h
    if not (np.isfinite(d1).all() and np.isfinite(d2).all() and np.isfinite(y0).all()):
        return INCONCLUSIVE, "NaN or Inf near x: y is not finite along v", 0.0
    size = np.abs(y0) + np.abs(plus) + np.abs(minus)
    roundoff = ROUNDOFF * EPS64 * size / h  # of d2, whose step is h/2
    if tiny is not None:
        measured = np.abs((tiny[0] - tiny[1]) / (2 * PROBE_SCALE * h) - d2) * PROBE_SCALE * 2
        if np.isfinite(measured).all():
            roundoff = PROBE_SAFETY * measured + 2 * EPS64 * size / h
    fd_err = np.abs(d1 - d2) + roundoff
    scale = element_scale(a, d2)
    bigger = np.maximum(np.abs(a), np.abs(d2))
    tol = np.maximum(ATOL_REL * scale, RTOL * bigger)
    diff = np.abs(a - d2)
    rel = float(diff.max(initial=0.0) / scale) if scale > 0 else float(diff.max(initial=0.0) > 0)
    # one-sided differences: a kink within the step keeps their gap as h halves; smooth, it halves too
    gap = np.abs((plus - y0) - (y0 - minus)) / h
    gap2 = np.abs((plus2 - y0) - (y0 - minus2)) / (h / 2)
    kink = (gap > np.maximum(tol, 4 * roundoff)) & (gap2 > 0.75 * gap)
    jump = np.abs(d1 - d2) > UNCONVERGED * np.maximum(bigger, ATOL_REL * scale)
    bad = (diff > tol) & (diff > 4 * fd_err)
    where = _first(bad & ~kink & ~jump)
    if where is not None:
        return FAIL, (f"J·v {a.flat[where]:.6g} vs finite differences {d2.flat[where]:.6g} at element {where} "
                      f"(error estimate {fd_err.flat[where]:.2g}; {int((bad & ~kink & ~jump).sum())} of {a.size} "
                      "elements off)"), rel
    if kink.any() or (jump & (diff > tol)).any():  # at a kink there is no derivative to agree with
        return INCONCLUSIVE, "not differentiable here: a kink or jump within the step along v", rel
    exact = (a == 0) & (d2 == 0)
    unresolved = ~exact & ((fd_err > RESOLVED_REL * scale) | (diff > np.maximum(tol, fd_err)))
    if unresolved.any():
        k = _first(unresolved)
        return INCONCLUSIVE, (f"finite differences not accurate enough: error estimate {fd_err.flat[k]:.2g} "
                              f"at element {k}, J·v's scale {scale:.2g}"), rel
    return PASS, "", rel


def _first(mask: np.ndarray) -> int | None:
    hit = np.flatnonzero(mask)
    return int(hit[0]) if hit.size else None


def transpose_residual(u: np.ndarray, jv: np.ndarray, grads: dict, v: dict) -> tuple[float, float, float]:
    """(<u, J v>, <Jᵀu, v>, |difference| over the sums' magnitude): zero up to rounding."""
    lhs = float(np.sum(u * jv))
    terms = [np.asarray(grads[x], dtype=np.float64) * v[x] for x in v]
    rhs = float(sum(np.sum(t) for t in terms))
    magnitude = float(np.sum(np.abs(u * jv)) + sum(np.sum(np.abs(t)) for t in terms))
    return lhs, rhs, (abs(lhs - rhs) / magnitude if magnitude > 0 else float(lhs != rhs))


def check_y(model, y: str, xs, zs, feeds: dict, seed: int, outputs: Callable[[dict], np.ndarray]) -> YCheck:
    values = {n: np.asarray(a, dtype=np.float64) if n in xs else a for n, a in feeds.items()}
    y0 = outputs(values)
    u = np.random.default_rng((seed, 37)).standard_normal(y0.shape)
    grad = model.gradient(y, xs, zs, feeds, dy=u, dtype="float64", seed=seed)
    v = tangents_for(values, xs, seed)
    for x in grad.disconnected:  # as the VJP check: y does not depend on x, so J·v along it is zero
        v[x] = np.zeros_like(v[x])
    res = model.jvp(y, xs, v, zs, feeds, dtype="float64", seed=seed)
    jv = np.asarray(res.jvp, dtype=np.float64)
    if not np.isfinite(jv).all():
        bad = int((~np.isfinite(jv)).sum())
        also = " (y itself is not finite there)" if not np.isfinite(res.y).all() else ""
        return YCheck(NONFINITE, f"J·v holds {bad} NaN/Inf of {jv.size}{also}")
    if all(x in grad.disconnected for x in xs):  # nothing to difference (and a sample would jump)
        if np.any(jv != 0):
            return YCheck(FAIL, f"J·v is not zero (max |J·v| {np.abs(jv).max():.3g}) though y depends on no x")
        return YCheck(PASS, "y depends on no x: J·v is zero")
    h = STEP
    runs = [outputs(_along(values, v, t)) for t in (h, -h, h / 2, -h / 2, PROBE_SCALE * h, -PROBE_SCALE * h)]
    if any(r.shape != y0.shape for r in runs):
        return YCheck(INCONCLUSIVE, f"y's shape {y0.shape} changes along v (a shape jump: "
                                    f"{sorted({r.shape for r in runs} - {y0.shape})[0]})")
    status, reason, rel = compare_jvp(jv, y0, *runs[:4], h, tiny=runs[4:])
    grads = {x: grad.grads.get(x, np.zeros_like(v[x])) for x in xs}
    if not all(np.isfinite(g).all() for g in grads.values()):
        # reverse mode's own finding (a 0 * NaN the forward pass hid): J·v stands on the differences alone
        return YCheck(status, reason or "transpose not checked: Jᵀu is not finite", rel)
    lhs, rhs, residual = transpose_residual(u, jv, grads, v)
    if residual > TRANSPOSE_EPS * EPS64:
        transposed = (f"transpose: <u, J v> = {lhs:.10g} but <Jᵀu, v> = {rhs:.10g} "
                      f"(residual {residual:.2g} of the sums' magnitude)")
        status, reason = FAIL, f"{reason}; {transposed}" if status == FAIL else transposed
    return YCheck(status, reason, rel, residual)


def check_case(case, seed: int = 0) -> JVPOutcome:
    from .. import load

    info = case_info(case)
    start = time.perf_counter()
    sel = selection_for(case)
    if isinstance(sel, str):
        status, _, reason = sel.partition(": ")
        return JVPOutcome(case.name, info.op, info.expanded, status, reason, seconds=time.perf_counter() - start)
    xs, zs, ys, feeds, _ = sel
    status, reason, rel, residual = PASS, "", 0.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = load(case.model, check=False)

            def outputs_of(y):
                return lambda values: np.asarray(model.run(values, outputs=[y], dtype="float64")[y], np.float64)

            for k, y in enumerate(ys):
                r = check_y(model, y, xs, zs, feeds, seed + k, outputs_of(y))
                rel, residual = max(rel, r.rel_err), max(residual, r.residual)
                if worse(r.status, status) != status or (r.status == status and not reason and r.reason):
                    status, reason = worse(r.status, status), f"d{y}: {r.reason}"
        except ForwardModeError as exc:
            status, reason = NO_FORWARD_RULE, str(exc).splitlines()[0][:300]
        except OnnxGradError as exc:
            status, reason = ERROR, str(exc).splitlines()[0][:300]
        except Exception as exc:  # a forward rule that raises: a finding, not a crash of the sweep
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            status, reason = ERROR, f"{type(exc).__name__}: {first}"[:300]
    note = documented(case.name) if status in (FAIL, NONFINITE, ERROR) else ""
    if status == NO_FORWARD_RULE:
        note = next((why for pattern, why in NO_RULE.items() if re.search(pattern, base_name(case.name))), "")
    return JVPOutcome(case.name, info.op, info.expanded, status, reason, tuple(xs), tuple(ys), note,
                      time.perf_counter() - start, rel, residual)


def jvp_sweep(cases: Iterable, *, seed: int = 0,
              progress: Callable[[int, int, JVPOutcome], None] | None = None) -> list[JVPOutcome]:
    """Check the given (forward-passing) cases."""
    cases = list(cases)
    out = []
    for i, case in enumerate(cases):
        out.append(check_case(case, seed))
        if progress is not None:
            progress(i + 1, len(cases), out[-1])
    return out


def op_jvp_status(outcomes: Iterable[JVPOutcome]) -> tuple[str, str]:
    """(status, note) for one op: fail > non-finite > error > no forward rule > inconclusive > pass."""
    outcomes = list(outcomes)
    status, note = op_gradient_status(outcomes)
    if status in (FAIL, NONFINITE, ERROR):
        return status, note
    refused = [o for o in outcomes if o.status == NO_FORWARD_RULE]
    if refused:
        return NO_FORWARD_RULE, f"{len(refused)}/{len(outcomes)} cases; {refused[0].name}: {refused[0].reason}"
    return (status, note) if status else (NOT_CHECKED, "")


def rule_exceptions(gradients: Iterable, jvps: Iterable[JVPOutcome]) -> list[tuple[object, JVPOutcome]]:
    """(VJP outcome, JVP outcome) of every case whose VJP check passes and whose JVP check does not:
    issue 36's rule allows only documented ones (NO_RULE: an op torch's forward AD lacks, named)."""
    passed = {g.name: g for g in gradients if g.status == PASS}
    return [(passed[j.name], j) for j in jvps if j.name in passed and j.status != PASS]


def jvp_record(gradients: Sequence, jvps: Sequence[JVPOutcome], previous: dict | None = None) -> dict:
    """What tests/jvp_floor.json keeps of a full sweep (every forward-passing case, VJP and JVP): totals,
    the docs/ops.md cell of every op, the JVP-passing cases (which must keep passing) and the rule's
    exceptions; refuses to drop a recorded passing case."""
    import collections

    import onnx

    passing = sorted(j.name for j in jvps if j.status == PASS)
    if previous:
        lost = sorted(set(previous.get("passing", [])) - set(passing))
        if lost:
            raise ValueError(f"{len(lost)} recorded cases no longer pass the JVP check, e.g. {lost[:5]}")
    by_op: dict[str, list[JVPOutcome]] = {}
    for j in jvps:
        by_op.setdefault(j.op, []).append(j)
    cells = {op: op_jvp_status(group) for op, group in sorted(by_op.items())}
    return {
        "onnx": onnx.__version__,
        "cases": len(jvps),
        "vjp": dict(sorted(collections.Counter(g.status for g in gradients).items())),
        "jvp": dict(sorted(collections.Counter(j.status for j in jvps).items())),
        "documented": sum(bool(j.documented) for j in jvps),
        "max_rel_err": max((j.max_rel_err for j in jvps if j.status == PASS), default=0.0),
        "max_transpose_residual": max((j.transpose_residual for j in jvps if j.status == PASS), default=0.0),
        "exceptions": [{"name": j.name, "vjp": g.status, "jvp": j.status, "reason": j.reason[:200],
                        "documented": j.documented} for g, j in rule_exceptions(gradients, jvps)],
        "ops": {op: [status, cell_note(status, note)] for op, (status, note) in cells.items() if status},
        "passing": passing,
    }


def cell_note(status: str, note: str) -> str:
    """An op's note in the jvp column: none for a plain pass (the gradient column counts the cases) or
    for nothing to check (the gradient column says why: the same `selection_for`)."""
    if status in (NOT_DIFFERENTIABLE, NOT_CHECKED) or (status == PASS and re.fullmatch(r"\d+ cases?", note)):
        return ""
    return note[:200]


def jvp_column(record: dict):
    """The *jvp* column of docs/ops.md, from a recorded full sweep (`jvp_record`)."""
    import collections

    from .report import Column

    counts = ", ".join(f"{n} {s}" for s, n in sorted(record["jvp"].items(), key=lambda kv: -kv[1]))
    vjp_pass = record["vjp"].get(PASS, 0)
    exceptions = record["exceptions"]
    kinds = collections.Counter(e["jvp"] for e in exceptions)
    summary = (f"JVP (`Model.jvp` in float64 along a random v against float64 central differences, and "
               f"<u, Jv> = <Jᵀu, v> with the engine's reverse gradient; every forward-passing case, "
               f"{record['cases']}): {counts}. Of the {vjp_pass} cases whose VJP check passes, "
               f"{vjp_pass - len(exceptions)} pass the JVP check"
               + (f"; the other {len(exceptions)}: " + ", ".join(f"{n} `{k}`" for k, n in kinds.most_common())
                  + ", ops torch's forward AD lacks, each named (engine/conformance/jvps.py NO_RULE)"
                  if exceptions else "") + ".")
    legend = ("*jvp* is `onnxgrad conformance --jvp` over every forward-passing case, with the gradient column's "
              "verdicts plus `no forward rule` (the engine names the node whose op has no JVP).")
    return Column("jvp", legend, summary, {op: tuple(cell) for op, cell in record["ops"].items()})
