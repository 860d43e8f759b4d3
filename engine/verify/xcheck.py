"""One x: choose the items (every element, a sample, or random directions), measure, judge, report."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import absorbed, fd, steps, verdict
from .batching import BatchEvaluator
from .report import ItemProblem, XCheck
from .status import FAIL, INCONCLUSIVE, PASS, SKIPPED, UNCHECKED
from .structure import RowSplit, independent_rows, rows_through_tail

MAX_PROBLEMS = 20
ROUNDOFF_SAFETY = 4.0  # the analytic gradient's rounding error: a bound over one sample of it


@dataclass
class Options:
    mode: str  # full | sample | fast
    samples: int
    directions: int
    rtol: float | None
    atol: float | None
    seed: int
    chunk: int  # perturbed evaluations per batched call


class XProbe:
    """Finite differences of L = <dy, f(x)> for one x; judged against any analytic gradient of it."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 y0: torch.Tensor, dy: torch.Tensor, opts: Options, salt: int, control: fd.Control,
                 stage: str = "finite differences", compress: bool = True, memo: dict | None = None,
                 magnitude: Callable[[], float] | None = None, split: Callable[[], RowSplit | None] | None = None,
                 along: torch.Tensor | None = None, directions: torch.Tensor | None = None,
                 retry_coarse: bool = True):
        """`memo`: a dict kept across checks of the same graph, x and x shape: the batching strategy
        and whether rows mix are properties of the graph, measured once. `magnitude`: the largest
        value downstream of x (asked only when a verdict may rest on a step it rounds away).
        `split`: <dy, y> read before y's trailing reduction, for rows that mix only there
        (see structure.py); asked only in full mode when y's own rows mix. `along`: in fast mode, one
        more direction after the random ones (the gradient's own: its slope |g|^2 cannot cancel).
        `directions`: in fast mode, these directions instead of random ones. `retry_coarse`: measure
        coarse items (unresolved, inaccurate) at other steps (off where a better comparison follows)."""
        self.name, self.x, self.opts, self.control, self.stage = name, x, opts, control, stage
        self._magnitude, self._largest = magnitude, None
        self.laddered = np.zeros(0, np.int64)  # items absorbed.settle measured at larger steps
        self.unresolved = False  # whether the last judge left items absorbed.settle could not resolve
        self._done_before = control.done
        self.retry_coarse = retry_coarse
        self._persisted: dict = {}  # the last persistence measurement (steps.persist)
        memo = {} if memo is None else memo
        self._memo = memo
        self.evaluator = BatchEvaluator(fn, shape=y0.shape, state=memo.setdefault("batching", {}))
        rows = 1
        if opts.mode == "full" and compress:
            key = ("rows", opts.chunk)
            if key not in memo:
                memo[key] = independent_rows(self.evaluator, x, y0, opts.seed + salt, max_batch=opts.chunk)
            rows = memo[key]
            if rows == 1 and split is not None:
                rows, y0, dy = self._through_tail(split, y0, dy, salt)
        self.rows = rows
        if rows > 1:  # callers plan progress for one element per vector; shared rows need fewer
            control.plan(-(2 * x.numel() - 2 * (x.numel() // rows)))
        self.objective = fd.Objective(self.evaluator, y0, dy, rows)
        self.verdicts: verdict.Verdicts | None = None  # from the last judge
        self.pert, self.order = self._perturbations(salt, along, directions)
        # A direction's quotient sums every element's contribution, so the eps*S roundoff bound is
        # small beside it: measuring the roundoff would cost more forwards than the directions.
        probes = 0 if self.pert.kind == "directions" else max(1, min(fd.PROBES, self.pert.count // 4))
        control.plan(2 * probes)
        self.m = fd.measure(self.objective, x, self.pert, self.order, opts.chunk, control, stage, probes=probes)
        self.noise_l = self.m.noise_l

    def _through_tail(self, split: Callable[[], RowSplit | None], y0: torch.Tensor, dy: torch.Tensor, salt: int):
        """(rows, p0, w) when L can be read row by row before y's trailing reduction, else (1, y0, dy);
        self.evaluator then runs x -> p."""
        key = ("tail rows", self.opts.chunk)
        if self._memo.get(key, 2) < 2:
            return 1, y0, dy
        found = split()
        if found is None:
            return 1, y0, dy
        evaluator = BatchEvaluator(found.fn, shape=found.p0.shape, state=self._memo.setdefault("tail batching", {}))
        if key not in self._memo:
            self._memo[key] = rows_through_tail(found, evaluator, self.evaluator, self.x, y0, dy,
                                                self.opts.seed + salt, max_batch=self.opts.chunk)
        if self._memo[key] < 2:
            return 1, y0, dy
        self.evaluator = evaluator
        return self._memo[key], found.p0, found.weights

    def _perturbations(self, salt: int, along: torch.Tensor | None = None, directions: torch.Tensor | None = None):
        x, opts = self.x, self.opts
        n = x.numel()
        if opts.mode == "fast" and directions is not None:
            self.directions = directions.to(dtype=x.dtype, device=x.device)
            return fd.direction_perturbations(x, self.directions), torch.arange(len(directions))
        if opts.mode == "fast":
            # The same seed draws the same directions: a check repeated at new values reuses them
            # (only the last draw is kept, so a sweep over seeds holds one set).
            key = (opts.seed, salt, opts.directions, x.dtype, x.device)
            last = self._memo.get("directions")
            if last is None or last[0] != key:
                # Random signs, not Gaussian entries: every coordinate moves by the same step, so no
                # coordinate's move is several times the step and crosses kinks the others do not.
                signs = np.random.default_rng([opts.seed, salt]).integers(0, 2, size=(opts.directions,) + tuple(x.shape))
                last = fd.keep_draw(self._memo, "directions", (
                    key, torch.from_numpy(2.0 * signs - 1.0).to(dtype=x.dtype, device=x.device), torch.arange(opts.directions)))
            self.directions, order = last[1], last[2]
            extra = _unit_rms(along)
            if extra is not None:
                self.directions = torch.cat([self.directions, extra.to(self.directions).reshape((1,) + tuple(x.shape))])
                order = torch.arange(len(self.directions))
            return fd.direction_perturbations(x, self.directions), order
        chosen, rng = sample_elements(n, opts.samples if opts.mode == "sample" else n, opts.seed, salt)
        if opts.mode == "sample" and opts.samples < n:
            groups = torch.as_tensor(chosen, device=x.device).reshape(-1, 1)
        else:
            groups = torch.arange(n, device=x.device).reshape(self.rows, n // self.rows).T.contiguous()
        pert = fd.element_perturbations(x, groups)
        order = torch.as_tensor(rng.permutation(pert.count))  # a cut-short run is a random sample
        return pert, order

    # --- judging ------------------------------------------------------------------------------
    def analytic_items(self, grad: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(the analytic value of each item, the scale of its terms) for a gradient shaped like x."""
        g = grad.detach().to(torch.float64)
        if self.pert.kind == "directions":
            return fd.direction_items(g, self.directions)
        a = g.reshape(-1)[self.pert.elements.reshape(-1)].cpu().numpy()
        return a, None

    def judge(self, grad: torch.Tensor, roundoff: torch.Tensor | None = None) -> verdict.Verdicts:
        self.verdicts = self._judge(grad, roundoff)
        return self.verdicts

    def _judge(self, grad: torch.Tensor, roundoff: torch.Tensor | None = None) -> verdict.Verdicts:
        """Verdicts for `grad`; `roundoff` (shaped like x, see Context.analytic_roundoff) samples its
        rounding errors, which widen atol."""
        a, _ = self.analytic_items(grad)
        slack = None if roundoff is None else self._slack(roundoff)

        def tolerance(m: fd.Measurement | None = None, strict: bool = False) -> verdict.Tolerance:
            """From self.m, or from `m`: another step's measurement (absorbed.py); `strict`: atol not
            raised to the finite differences' resolution."""
            m = m or self.m
            slopes = self.pert.kind == "directions"
            if slopes:
                scale = a
            else:
                measured = (self.m,) if m is self.m else (self.m, m)
                scale = max(verdict.element_scale(a[k.evaluated], k.d1[k.evaluated]) for k in measured)
            tol = verdict.tolerance(len(a), self.opts.rtol, self.opts.atol, scale, None if strict else m.noise,
                                    slopes=slopes)
            return tol if slack is None else verdict.widened(tol, slack)

        tol = tolerance()
        worst_too = self.pert.count >= 64
        if not worst_too:
            self.analytic = a
            v = verdict.all_clear(a, self.m, tol)
            if v is not None and (self._magnitude is None or not absorbed.zero_readings(self.m).any()):
                return v
        undecided = verdict.doubtful(a, self.m, tol) if self.noise_l is None else ()
        if len(undecided):  # the roundoff bound was too coarse to decide: measure it, then judge again
            # Probe decided vectors first: an undecided one's quotient may carry truncation error,
            # which the probe would count as roundoff.
            doubt = np.unique(undecided // self.rows)
            probes = max(1, min(fd.PROBES, self.pert.count // 4))
            vectors = np.concatenate([np.setdiff1d(self.order.numpy(), doubt), doubt])[:probes]
            fd.measure_roundoff(self.objective, self.x, self.pert, self.m, vectors, self.opts.chunk, self.control)
            self.noise_l = self.m.noise_l
            tol = tolerance()
        # Refining a clear pass only buys its Richardson error estimate (else: the measured roundoff):
        # worth a batched call when it is a small part of the whole.
        picks = verdict.to_refine(a, self.m, tol, worst_too=worst_too)
        fd.refine(self.objective, self.x, self.pert, self.m, picks, self.opts.chunk, self.control)
        self.analytic = a
        v = verdict.classify(a, self.m, tol)
        # Larger steps first, where the network may round small ones away: a quantized quotient
        # looks like a kink, which the retries below would chase with smaller steps.
        marks = absorbed.settle(self, a, tolerance, v)
        self.unresolved = bool(marks)
        if marks is not None:
            tol = tolerance()
            v = absorbed.marked(verdict.classify(a, self.m, tol), marks)
        if steps.retry(self, a, tol, v):
            v = absorbed.marked(verdict.classify(a, self.m, tol), marks)
        steps.persist(self, a, tol, v)
        if self.pert.kind == "directions":
            steps.confirm_directions(self, grad, v)
        return v

    def smallest_scale(self, items: np.ndarray) -> float:
        """The smallest step scale (times h) not rounded away for `items`: ABSORB_ULPS ulps of the
        largest value downstream of x (absorbed.py), and steps.PERSIST_ULPS ulps of x itself."""
        taken = self.pert.step.reshape(-1)[items]
        if len(taken) == 0:
            return 0.0
        h = float(taken.min())
        big = float(self.x.detach().abs().max()) if self.x.numel() else 0.0
        floor = steps.PERSIST_ULPS * float(np.spacing(big)) / h
        magnitude = self.downstream_magnitude()
        if magnitude and np.isfinite(magnitude):
            floor = max(floor, absorbed.ABSORB_ULPS * float(np.spacing(magnitude)) / h)
        return floor

    def downstream_magnitude(self) -> float:
        """The largest |value| downstream of x, y included (0 when unknown)."""
        if self._largest is None:
            self._largest = float(self._magnitude()) if self._magnitude is not None else 0.0
        return self._largest

    def _slack(self, roundoff: torch.Tensor) -> np.ndarray:
        """Per item, how far rounding may have moved the analytic value: one sample per element is
        no bound, so an element gets ROUNDOFF_SAFETY times the largest of x (they share the
        backward's magnitudes), a direction the sum of those over its terms."""
        level = ROUNDOFF_SAFETY * roundoff.detach().to(torch.float64).abs().max()
        if self.pert.kind == "directions":
            return fd.direction_items(torch.full_like(roundoff, float(level), dtype=torch.float64), self.directions)[1]
        return np.full(self.pert.items, float(level))

    def item_index(self, item: int) -> tuple[tuple[int, ...] | None, int | None]:
        if self.pert.kind == "directions":
            return None, int(item)
        flat = int(self.pert.elements.reshape(-1)[item])
        return tuple(int(i) for i in np.unravel_index(flat, tuple(self.x.shape))) if self.x.dim() else (), None

    def result(self, v: verdict.Verdicts, **extra) -> XCheck:
        a = self.analytic
        status = v.status
        is_fail, is_inconclusive, is_pass = status == FAIL, status == INCONCLUSIVE, status == PASS
        failed, inconclusive = int(is_fail.sum()), int(is_inconclusive.sum())
        checked = int(np.sum(status != UNCHECKED))
        conclusive = is_pass | is_fail
        worst = _worst(status, v.ratio)
        overall = FAIL if failed else (INCONCLUSIVE if inconclusive or checked == 0 else PASS)
        reason = ""
        if len(status) == 0:  # an empty x: nothing to check, nothing wrong
            overall, reason = PASS, f"skipped: empty ({self.name!r} has no elements)"
        if checked < len(status):  # a cut-off check passes nothing: what was not checked may be wrong
            unit = 'directions' if self.pert.kind == 'directions' else 'elements'
            reason = f"checked {checked} of {len(status)} {unit} ({self.control.stopped or 'stopped'})"
            if overall == PASS:
                overall = INCONCLUSIVE
        fields = dict(name=self.name, status=overall, max_abs_err=None, max_rel_err=None, worst_index=None,
                      analytic=None, numeric=None, fd_error=None, checked=checked, failed=failed,
                      inconclusive=inconclusive, reason=reason, kind=self.pert.kind,
                      shape=tuple(self.x.shape), total=self.x.numel(),
                      step=float(self.pert.step.max()) if self.pert.step.size else 0.0,
                      rtol=verdict.RTOL if self.opts.rtol is None else self.opts.rtol,
                      strategy=self.evaluator.strategy or "", rows=self.rows,
                      forwards=self.control.done - self._done_before)
        if conclusive.any():
            fields["max_abs_err"] = float(np.max(v.abs_err[conclusive]))
            fields["max_rel_err"] = float(np.max(v.rel_err[conclusive]))
        if worst is not None:
            index, direction = self.item_index(worst)
            fields.update(worst_index=index, worst_direction=direction, analytic=float(a[worst]),
                          numeric=float(v.numeric[worst]), fd_error=float(v.fd_error[worst]),
                          atol=float(v.atol[worst]),
                          signal=None if v.signal is None else float(v.signal[worst]))
            if fields["max_abs_err"] is None:
                fields["max_abs_err"], fields["max_rel_err"] = float(v.abs_err[worst]), float(v.rel_err[worst])
        # A failure is explained by the worst one; an inconclusive x by its first inconclusive item.
        explain = worst if worst is not None and status[worst] == FAIL else None
        if explain is None and inconclusive:
            explain = int(np.nonzero(status == INCONCLUSIVE)[0][0])
        if explain is not None:
            index, direction = self.item_index(explain)
            where = f"element {list(index)}" if index is not None else f"direction {direction}"
            why = v.reasons.get(explain) or (f"analytic {a[explain]:.6g} vs numeric {v.numeric[explain]:.6g} "
                                             f"(|diff| {v.abs_err[explain]:.3g} > tolerance "
                                             f"{v.abs_err[explain] / max(v.ratio[explain], 1e-300):.3g})")
            fields["reason"] = "; ".join(p for p in (f"{where}: {why}", reason) if p)
        fields["problems"] = self._problems(v) if failed or inconclusive else ()
        fields.update(extra)
        return XCheck(**fields)

    def _problems(self, v: verdict.Verdicts) -> tuple[ItemProblem, ...]:
        bad = np.nonzero((v.status == FAIL) | (v.status == INCONCLUSIVE))[0]
        bad = bad[np.lexsort((-np.nan_to_num(v.ratio[bad], nan=np.inf), v.status[bad] != FAIL))]
        out = []
        for i in bad[:MAX_PROBLEMS]:
            index, direction = self.item_index(int(i))
            out.append(ItemProblem(status=str(v.status[i]), index=index, direction=direction,
                                   analytic=float(self.analytic[i]), numeric=float(v.numeric[i]),
                                   abs_err=float(v.abs_err[i]), rel_err=float(v.rel_err[i]),
                                   fd_error=float(v.fd_error[i]), reason=v.reasons.get(int(i), "")))
        return tuple(out)


def sample_elements(n: int, samples: int, seed: int, salt: int) -> tuple[np.ndarray, np.random.Generator]:
    """(the flat elements sample mode checks of an x with n elements, the generator drawn from): the
    same seed and salt (the x's place in xs) draw the same elements, so a report can be replayed."""
    rng = np.random.default_rng([seed, salt])
    if samples < n:
        return np.sort(rng.choice(n, size=samples, replace=False)), rng
    return np.arange(n), rng



def _unit_rms(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` scaled to an RMS of 1, like a +-1 direction (None when it has no finite, nonzero entries)."""
    if t is None or t.numel() == 0:
        return None
    t = t.detach().to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        return None
    rms = float(torch.linalg.vector_norm(t)) / t.numel() ** 0.5
    return t / rms if rms > 0 else None



def _worst(status: np.ndarray, ratio: np.ndarray) -> int | None:
    """The failing item furthest out of tolerance; else an inconclusive one (what the x's verdict is
    about); else the worst passing one."""
    for wanted in (FAIL, INCONCLUSIVE, PASS):
        mask = status == wanted
        if mask.any():
            r = np.where(mask, np.where(np.isnan(ratio), np.inf, ratio), -np.inf)
            return int(np.argmax(r))
    return None


def skipped(name: str, shape, reason: str, status: str = SKIPPED) -> XCheck:
    return XCheck(name=name, status=status, max_abs_err=None, max_rel_err=None, worst_index=None,
                  analytic=None, numeric=None, fd_error=None, checked=0, failed=0, inconclusive=0,
                  reason=reason, shape=tuple(shape), total=int(np.prod(shape)) if len(shape) else 1)
