"""Central finite differences in float64, batched: many perturbed forwards per call, chunked.

The checked quantity is L = <dy, y(x)>, whose gradient is the VJP under test. A perturbation set
holds G perturbation vectors of x; when the rows of x act on the rows of y independently (see
structure.py) one vector perturbs an element in each of R rows at once and L is read per row, so
R elements cost one pair of forwards. Each item (vector g, row r) yields

    D(h)  = (L(x + h) - L(x - h)) / 2h        the central difference,
    f+, f- = one-sided differences from L(x)  free, since L(x) is known,

and, for the few items whose verdict is in doubt, the same at h/2 (Richardson). Error model:
truncation is O(h^2) and tiny at these steps; the roundoff in L is measured (`_roundoff`: a
couple of vectors also differenced at a 1000 times smaller step, in the same batched call), and
a quotient carries that over h. Without a measurement, ROUNDOFF * eps * S bounds it, where
S = sum |dy * y| over the row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .batching import BatchEvaluator

STEP = 1e-6  # relative step, times max(1, |x|): float64 central differences
ROUNDOFF = 16.0  # rounding error of L when unmeasured, in units of eps * sum |dy * y|
EPS64 = float(np.finfo(np.float64).eps)
PROBES = 2  # vectors whose quotient at a tiny step measures the roundoff
PROBE_SCALE = 1e-3
PROBE_SAFETY = 8.0


def normal(shape, seed, like: torch.Tensor) -> torch.Tensor:
    """Seeded standard normals shaped `shape`, as float64 on `like`'s device (numpy's PCG64: a fresh
    torch.Generator costs a millisecond to seed, which adds up over many small checks)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal(tuple(shape))).to(device=like.device)


@dataclass(frozen=True)
class Perturbations:
    """G perturbation vectors of x, each read on `rows` independent rows."""

    kind: str  # "elements" or "directions"
    count: int
    rows: int
    step: np.ndarray  # [G, R] float64: the step h of each item
    # (vector ids, step scales: one float, or a tensor with one per vector) -> [K, *x.shape]
    build: Callable[[torch.Tensor, torch.Tensor | float], torch.Tensor]
    elements: torch.Tensor | None = None  # [G, R] flat element index of each item (elements kind)

    @property
    def items(self) -> int:
        return self.count * self.rows


def element_perturbations(x: torch.Tensor, groups: torch.Tensor, step: float = STEP) -> Perturbations:
    """groups[g, r]: the flat index of the element that vector g moves in row r (one column per row)."""
    flat = x.detach().reshape(-1)
    h = step * torch.clamp(flat.abs(), min=1.0)[groups]

    def build(ids: torch.Tensor, scale) -> torch.Tensor:
        deltas = torch.zeros((len(ids), flat.numel()), dtype=x.dtype, device=x.device)
        scaled = scale * h[ids] if isinstance(scale, float) else scale.to(h).unsqueeze(1) * h[ids]
        deltas.scatter_(1, groups[ids], scaled)
        return deltas.reshape((len(ids),) + tuple(x.shape))

    step_h = h.detach().cpu().numpy().astype(np.float64)
    return Perturbations("elements", groups.shape[0], groups.shape[1], step_h, build, groups)


def direction_perturbations(x: torch.Tensor, directions: torch.Tensor, step: float = STEP) -> Perturbations:
    """directions[k]: a vector shaped like x; the step is relative to x's RMS."""
    rms = float(torch.linalg.vector_norm(x.detach())) / x.numel() ** 0.5 if x.numel() else 0.0
    t = step * max(1.0, rms)
    everything = directions.shape[0]

    def build(ids: torch.Tensor, scale) -> torch.Tensor:
        chosen = directions[ids]
        if isinstance(scale, float):
            return (t * scale) * chosen
        shape = (len(ids),) + (1,) * x.dim()
        return (t * scale.to(directions)).reshape(shape) * chosen

    return Perturbations("directions", everything, 1, np.full((everything, 1), t), build)


# A random draw (directions, dy) is kept for the next check of the same selection only up to this
# size: the memo lives as long as the model, and a weight-sized draw (GPT-2's embedding: 0.31 GB in
# float64) would stay for the session, while drawing it again costs little beside its forwards.
KEPT_DRAW_BYTES = 16 << 20


def keep_draw(memo: dict, name: str, entry: tuple) -> tuple:
    """`entry` (key, tensor, ...), kept in `memo[name]` when its tensor is small, else dropped there."""
    t = entry[1]
    if t.numel() * t.element_size() <= KEPT_DRAW_BYTES:
        memo[name] = entry
    else:
        memo.pop(name, None)
    return entry


class Objective:
    """L per row for a batch of values of one x, the other inputs held at their values, read as
    L(x') - L(x) = <dy, y(x') - y(x)>: the differences are formed before the sum, so the outputs a
    step does not move add exact zeros instead of their rounding (a saturated sigmoid's 1.0 in every
    term made L's roundoff 3% of an element's slope; centred, it is the moved terms' own)."""

    def __init__(self, evaluator: BatchEvaluator, y0: torch.Tensor, dy: torch.Tensor, rows: int = 1):
        self.evaluator = evaluator
        evaluator.shape = tuple(y0.shape)
        self.dy = dy
        self.y0 = y0
        self.rows = rows
        weighted = (dy * y0).reshape(rows, -1)
        self.base = np.zeros(rows)  # L(x) - L(x) per row: every reading is relative to the point
        self.scale = weighted.abs().sum(-1).cpu().numpy()  # S per row, for the roundoff bound

    def __call__(self, xb: torch.Tensor) -> torch.Tensor:
        moved = torch.sub(self.evaluator(xb), self.y0)  # the batch's outputs are dropped as soon as it exists
        return moved.mul_(self.dy).reshape(xb.shape[0], self.rows, -1).sum(-1)


@dataclass
class Measurement:
    """Difference quotients for every item (flattened g * R + r), numpy float64."""

    d1: np.ndarray
    fplus1: np.ndarray
    fminus1: np.ndarray
    noise: np.ndarray  # roundoff bound of a quotient at step h
    d2: np.ndarray  # at h/2; NaN where not refined
    fplus2: np.ndarray
    fminus2: np.ndarray
    refined: np.ndarray  # bool
    evaluated: np.ndarray  # bool: False where a stop or budget came first
    scale: float = 1.0  # the step used, as a multiple of the perturbation set's step
    noise_l: np.ndarray | None = None  # measured roundoff in L per row, when probes were run
    reshaped: np.ndarray | None = None  # bool: a perturbed forward changed y's shape
    # A probe's tiny step changed L not at all while its step-h quotient is nonzero: the network
    # rounds such steps away (see absorbed.py), so the measured roundoff is only a lower bound.
    saturated: bool = False
    ladder: np.ndarray | None = None  # per item: the larger step scale it was adopted from (absorbed.py), else 0
    richardson: np.ndarray | None = None  # bool per item: extrapolate whatever the noise (see verdict.classify)

    @classmethod
    def empty(cls, n: int, scale: float = 1.0) -> "Measurement":
        nan = lambda: np.full(n, np.nan)  # noqa: E731
        return cls(nan(), nan(), nan(), nan(), nan(), nan(), nan(), np.zeros(n, bool), np.zeros(n, bool), scale,
                   reshaped=np.zeros(n, bool), ladder=np.zeros(n), richardson=np.zeros(n, bool))

    def take(self, other: "Measurement", items: np.ndarray) -> None:
        """Adopt `other`'s quotients (another step) for `items`."""
        for name in ("d1", "fplus1", "fminus1", "noise", "d2", "fplus2", "fminus2", "refined", "evaluated",
                     "reshaped", "ladder", "richardson"):
            getattr(self, name)[items] = getattr(other, name)[items]


class Control:
    """Progress, cancellation and the time budget, shared by every stage of one check."""

    def __init__(self, progress=None, should_stop=None, deadline: float | None = None):
        import time

        self._time = time.monotonic
        self._progress = progress
        self._should_stop = should_stop
        self.deadline = deadline
        self.done = 0
        self.total = 0
        self._last = 0.0
        self.stopped = ""  # "cancelled" or "time budget"

    def plan(self, n: int) -> None:
        self.total += n

    def tick(self, n: int, stage: str, force: bool = False) -> None:
        self.done += n
        now = self._time()
        if self._progress is not None and (force or now - self._last >= 0.05):
            self._last = now
            self._progress(min(self.done, self.total), max(self.total, self.done), stage)

    def halted(self, budget_applies: bool = True) -> bool:
        if self.stopped == "cancelled":
            return True
        if self._should_stop is not None and self._should_stop():
            self.stopped = "cancelled"
            return True
        if budget_applies and self.deadline is not None and self._time() > self.deadline:
            self.stopped = self.stopped or "time budget"
            return True
        return False


def run_pairs(objective: Objective, x: torch.Tensor, pert: Perturbations, ids: torch.Tensor, scale,
              chunk: int, control: Control, stage: str, budget_applies: bool = True):
    """L(x + s*delta) and L(x - s*delta) for the vectors `ids` (s: one scale, or one per vector):
    ([n, R], [n, R], how many were evaluated before a stop, [n] whether y's shape changed)."""
    n = len(ids)
    # Small bookkeeping stays in numpy: on tensors this size a torch call costs 10 us of dispatch.
    scales = float(scale) if np.ndim(scale) == 0 else torch.as_tensor(np.asarray(scale, dtype=np.float64))
    plus = np.full((n, pert.rows), np.nan)
    minus = plus.copy()
    reshaped = np.zeros(n, bool)
    k = max(1, chunk // 2)
    done = 0
    base = x.detach()
    while done < n:
        if control.halted(budget_applies):
            break
        sel = slice(done, done + k)
        deltas = pert.build(ids[sel], scales if isinstance(scales, float) else scales[sel])
        m = len(deltas)
        # x + delta and x - delta written into one batch: no sum, difference or cat of them held beside it
        batch = base.expand((2 * m,) + tuple(base.shape)).clone()
        batch[:m].add_(deltas)
        batch[m:].sub_(deltas)
        del deltas
        with torch.no_grad():
            values = objective(batch).detach().to(torch.float64).cpu().numpy()
        del batch
        changed = objective.evaluator.changed
        if changed is not None:
            reshaped[done:done + m] = np.logical_or(changed[:m], changed[m:])
        plus[done:done + m] = values[:m]
        minus[done:done + m] = values[m:]
        done += m
        control.tick(2 * m, stage)
    return plus, minus, done, reshaped


def measure(objective: Objective, x: torch.Tensor, pert: Perturbations, order: torch.Tensor, chunk: int,
            control: Control, stage: str = "finite differences", scale: float = 1.0,
            budget_applies: bool = True, noise_l: np.ndarray | None = None, probes: int = 0) -> Measurement:
    """First pass at step scale*h over the vectors in `order` (a permutation, so a cut is a random sample).

    With `probes`, that many vectors are also measured at a step PROBE_SCALE times smaller, in the
    same batched calls, to measure the roundoff in L (see `_roundoff`); otherwise `noise_l` (or
    the eps*S formula) sets the noise.
    """
    m = Measurement.empty(pert.items, scale)
    k = min(probes, len(order))
    ids, scales = order, float(scale)
    if k:
        ids = torch.cat([order[:k], order])
        scales = np.concatenate([np.full(k, scale * PROBE_SCALE), np.full(len(order), float(scale))])
    plus, minus, done, reshaped = run_pairs(objective, x, pert, ids, scales, chunk, control, stage, budget_applies)
    done_main = max(0, done - k)
    ids_np = order[:done_main].numpy()
    it, h, l0, lp, lm = _quotient_inputs(objective, pert, ids_np, plus[k:k + done_main], minus[k:k + done_main], scale)
    m.reshaped[it] = np.repeat(reshaped[k:k + done_main], pert.rows)
    m.d1[it] = (lp - lm) / (2 * h)
    m.fplus1[it] = (lp - l0) / h
    m.fminus1[it] = (l0 - lm) / h
    m.evaluated[it] = True
    if k and done_main:
        probe_ids = order[:min(k, done_main)].numpy()
        lp, lm = plus[:len(probe_ids)], minus[:len(probe_ids)]
        noise_l = _roundoff(objective, pert, m, probe_ids, lp, lm, scale)
        m.noise_l = noise_l
        m.saturated = bool(np.any((lp == lm).reshape(-1) & (m.d1[_items(probe_ids, pert.rows)] != 0)))
    if noise_l is not None and np.isfinite(noise_l).all():
        m.noise[it] = np.tile(noise_l, len(ids_np)) / h
    else:
        s = np.tile(objective.scale, len(ids_np))
        m.noise[it] = ROUNDOFF * EPS64 * (s + np.abs(l0)) / h
    return m


def measure_bound(objective: Objective, pert: Perturbations, items: np.ndarray) -> np.ndarray:
    """The ROUNDOFF * eps * (S + |L0|) / h bound on each item's quotient at its step h."""
    items = np.asarray(items, dtype=np.int64)
    rows = items % pert.rows
    h = pert.step.reshape(-1)[items]
    return ROUNDOFF * EPS64 * (objective.scale[rows] + np.abs(objective.base[rows])) / h


def _roundoff(objective: Objective, pert: Perturbations, m: Measurement, probe_ids: np.ndarray, plus, minus,
              scale: float) -> np.ndarray:
    """The roundoff in L, per row, from quotients at a step PROBE_SCALE times smaller.

    There the quotient's error is the roundoff over the step, so |D(tiny) - D(h)| * tiny measures
    the noise in L itself, correlations between the two forwards included (the eps*S formula is
    often hundreds of times too pessimistic). The noise used is PROBE_SAFETY times the largest
    probe, and never below eps * (S + |L0|).
    """
    it, h, _, lp, lm = _quotient_inputs(objective, pert, probe_ids, plus, minus, scale * PROBE_SCALE)
    tiny = (lp - lm) / (2 * h)
    noise_l = (np.abs(tiny - m.d1[it]) * h).reshape(-1, pert.rows).max(0)
    floor = EPS64 * (objective.scale + np.abs(objective.base))
    return np.maximum(PROBE_SAFETY * np.nan_to_num(noise_l, nan=np.inf), floor)


def measure_roundoff(objective: Objective, x: torch.Tensor, pert: Perturbations, m: Measurement,
                     vectors: np.ndarray, chunk: int, control: Control) -> None:
    """The roundoff of L measured after the first pass (vectors re-differenced at a PROBE_SCALE
    times smaller step), for when the eps*S bound left items undecided; m.noise follows it."""
    ids = torch.as_tensor(np.asarray(vectors, dtype=np.int64))
    control.plan(2 * len(ids))
    plus, minus, done, _ = run_pairs(objective, x, pert, ids, m.scale * PROBE_SCALE, chunk, control, "roundoff",
                                     budget_applies=False)
    if not done:
        return
    m.noise_l = _roundoff(objective, pert, m, ids.numpy()[:done], plus[:done], minus[:done], m.scale)
    measured = np.unique(np.nonzero(m.evaluated)[0] // pert.rows)
    h = pert.step[measured].reshape(-1) * m.scale
    m.noise[_items(measured, pert.rows)] = np.tile(m.noise_l, len(measured)) / h


def refine(objective: Objective, x: torch.Tensor, pert: Perturbations, m: Measurement, items: np.ndarray,
           chunk: int, control: Control, stage: str = "refining") -> None:
    """Richardson's second step (half the measurement's step) for the vectors holding `items`."""
    if len(items) == 0:
        return
    vectors = np.unique(np.asarray(items, dtype=np.int64) // pert.rows)
    if m.refined.any():
        vectors = vectors[~np.isin(vectors, np.unique(np.nonzero(m.refined)[0] // pert.rows))]
    if len(vectors) == 0:
        return
    ids = torch.as_tensor(vectors)
    control.plan(2 * len(ids))
    # Refinement is few evaluations and decides verdicts already paid for: the budget does not cut it.
    plus, minus, done, reshaped = run_pairs(objective, x, pert, ids, 0.5 * m.scale, chunk, control, stage,
                                            budget_applies=False)
    it, h, l0, lp, lm = _quotient_inputs(objective, pert, vectors[:done], plus[:done], minus[:done], 0.5 * m.scale)
    m.reshaped[it] |= np.repeat(reshaped[:done], pert.rows)
    m.d2[it] = (lp - lm) / (2 * h)
    m.fplus2[it] = (lp - l0) / h
    m.fminus2[it] = (l0 - lm) / h
    m.refined[it] = True


def _quotient_inputs(objective: Objective, pert: Perturbations, ids: np.ndarray, plus, minus, scale: float):
    it = _items(ids, pert.rows)
    h = pert.step[ids].reshape(-1) * scale
    l0 = np.tile(objective.base, len(ids))
    return it, h, l0, plus.reshape(-1), minus.reshape(-1)


def _items(vectors: np.ndarray, rows: int) -> np.ndarray:
    return (np.asarray(vectors, dtype=np.int64)[:, None] * rows + np.arange(rows)[None, :]).reshape(-1)

def direction_items(g: torch.Tensor, directions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(<g, u>, sum |g * u|) for each direction u: the analytic slope and the scale of its terms."""
    u = directions.to(torch.float64).reshape(directions.shape[0], -1)
    flat = g.reshape(-1)
    if u.device.type == "cpu":  # numpy: torch's dispatch costs more than these products
        u, flat = u.numpy(), flat.detach().numpy()
        return u @ flat, np.abs(u) @ np.abs(flat)
    return (u @ flat).cpu().numpy(), (u.abs() @ flat.abs()).cpu().numpy()
