"""Run the verifier against mutants (mutants.py) of one model and tally what each mode concluded.

For each mutant the model is loaded with the mutant's VJP in place, and the float64 gradient the
check compares (its own context: same feeds, same dy) is measured against the right one. A mutant
counts when it moves that gradient by at least COUNTED (1%) in relative L2 norm over all xs, and by
more than the gradient's own rounding; the others cannot be told from the right gradient and are
listed, not judged. Each counted mutant is
then checked in every mode asked for:
- killed: the check failed;
- inconclusive: it did not decide (allowed, though the default should kill nearly all);
- survived: it passed a wrong gradient. Never allowed in full and fast mode. In sample mode a
  pass is allowed only when the mutant changed none of the sampled elements ("unseen").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import OnnxGradError
from .mutants import Mutant, candidates, injected
from .status import ERROR, FAIL, INCONCLUSIVE, KILLED, MUTANT_STATUSES, PASS, SURVIVED, UNSEEN

COUNTED = 0.01
ROUNDOFF_MARGIN = 100.0  # times the reference gradient's own rounding error
MODES = ("auto", "full", "fast", "sample")


@dataclass(frozen=True)
class MutantOutcome:
    mutant: Mutant
    moved: float  # relative L2 change of the float64 gradient over every x (nan: could not run)
    counted: bool
    outcomes: dict = field(default_factory=dict)  # mode -> killed / inconclusive / survived / unseen / error
    seconds: dict = field(default_factory=dict)  # mode -> seconds the check took
    error: str = ""


@dataclass(frozen=True)
class MutationReport:
    model: str
    y: str
    xs: tuple[str, ...]
    modes: tuple[str, ...]
    outcomes: tuple[MutantOutcome, ...]
    right: dict = field(default_factory=dict)  # mode -> the unmutated model's verdict

    def tally(self, mode: str) -> dict[str, int]:
        counts = dict.fromkeys(MUTANT_STATUSES, 0)
        for o in self.outcomes:
            if o.counted and mode in o.outcomes:
                counts[o.outcomes[mode]] += 1
        return counts

    @property
    def counted(self) -> int:
        return sum(o.counted for o in self.outcomes)

    def survivors(self, mode: str) -> list[MutantOutcome]:
        return [o for o in self.outcomes if o.counted and o.outcomes.get(mode) == SURVIVED]

    def summary(self) -> str:
        lines = [f"mutants of {self.model}: d{self.y}/d[{', '.join(self.xs)}]  {len(self.outcomes)} mutants, "
                 f"{self.counted} move the gradient by >= {COUNTED:.0%}"]
        for mode in self.modes:
            t = self.tally(mode)
            seconds = sum(o.seconds.get(mode, 0.0) for o in self.outcomes)
            extra = f", {t[UNSEEN]} unseen by the sample" if mode == "sample" else ""
            lines.append(f"  {mode:7} killed {t[KILLED]}, inconclusive {t[INCONCLUSIVE]}, survived {t[SURVIVED]}"
                         f"{extra}{f', {t[ERROR]} errors' if t[ERROR] else ''}  ({seconds:.1f}s)  "
                         f"unmutated: {self.right.get(mode, '-')}")
        for mode in self.modes:
            for o in self.survivors(mode):
                lines.append(f"  SURVIVED in {mode}: {o.mutant.label} (moves the gradient {o.moved:.3g})")
        return "\n".join(lines)


def run_mutants(load: Callable[[], object], y: str, xs: Sequence[str], zs: Sequence[str] = (),
                feeds: Mapping | None = None, *, modes: Sequence[str] = MODES, seed: int = 0,
                mutants: Sequence[Mutant] | None = None, progress: Callable | None = None,
                check_kwargs: Mapping | None = None) -> MutationReport:
    """`load()` returns a freshly loaded Model (called inside each mutant's injection)."""
    from ..verify.check import check
    from ..verify.context import build

    for mode in modes:
        if mode not in MODES:
            raise OnnxGradError(f"unknown mode {mode!r}: use {', '.join(MODES)}")
    extra = dict(check_kwargs or {})
    model = load()
    ctx = build(model, y, xs, zs, feeds, None, seed, "cpu", False)
    right = _flat(ctx)
    # A change no larger than the gradient's own rounding is no change (x / x's gradient is 1e-16 of
    # roundoff, and a mutant that zeroes it is "100% off"): a mutant must move it beyond that too.
    roundoff = ctx.analytic_roundoff()
    noise = float(np.sqrt(sum(float((r ** 2).sum()) for r in roundoff.values()))) if roundoff else 0.0
    spec = ctx.spec
    todo = list(mutants) if mutants is not None else candidates(ctx)
    verdicts = {m: check(model, y, xs, zs, feeds, mode=m, seed=seed, **extra).verdict for m in modes}
    outcomes = []
    for k, mutant in enumerate(todo):
        if progress is not None:
            progress(k, len(todo), mutant.label)
        outcomes.append(_one(mutant, load, y, xs, zs, feeds, seed, right, noise, modes, extra))
    return MutationReport(model.name, spec.y, spec.xs, tuple(modes), tuple(outcomes), verdicts)


def _flat(ctx) -> np.ndarray:
    return np.concatenate([ctx.grads64[x].detach().reshape(-1).cpu().numpy() for x in ctx.spec.xs]) \
        if ctx.spec.xs else np.zeros(0)


def _one(mutant, load, y, xs, zs, feeds, seed, right, noise, modes, extra) -> MutantOutcome:
    from ..verify.check import check
    from ..verify.context import build

    with injected(mutant):
        try:
            model = load()
            wrong = _flat(build(model, y, xs, zs, feeds, None, seed, "cpu", False))
        except Exception as exc:  # noqa: BLE001 - a mutant the op cannot take (shapes) is reported, not fatal
            return MutantOutcome(mutant, float("nan"), False, error=_first_line(exc))
        scale = float(np.linalg.norm(right))
        with np.errstate(invalid="ignore"):
            moved = float(np.linalg.norm(wrong - right) / scale) if scale > 0 else float(np.any(wrong != right))
        counted = bool(np.isfinite(moved) and moved >= COUNTED and np.isfinite(wrong).all()
                       and np.linalg.norm(wrong - right) > ROUNDOFF_MARGIN * noise)
        outcomes, seconds = {}, {}
        if counted:
            for mode in modes:
                started = time.monotonic()
                try:
                    report = check(model, y, xs, zs, feeds, mode=mode, seed=seed, locate=False, **extra)
                    outcomes[mode] = _outcome(report, right, wrong)
                except Exception as exc:  # noqa: BLE001
                    outcomes[mode] = ERROR
                    seconds[mode] = time.monotonic() - started
                    return MutantOutcome(mutant, moved, counted, outcomes, seconds, _first_line(exc))
                seconds[mode] = time.monotonic() - started
    return MutantOutcome(mutant, moved, counted, outcomes, seconds)


def _outcome(report, right: np.ndarray, wrong: np.ndarray) -> str:
    if report.verdict == FAIL:
        return KILLED
    if report.verdict != PASS:
        return INCONCLUSIVE
    if report.mode == "sample" and not _sample_saw(report, right, wrong):
        return UNSEEN
    return SURVIVED


def _sample_saw(report, right: np.ndarray, wrong: np.ndarray) -> bool:
    """Whether the elements sample mode checked include one the mutant changed."""
    from ..verify.xcheck import sample_elements

    offset = 0
    for k, r in enumerate(report.results):
        n = r.total
        changed = np.nonzero(right[offset:offset + n] != wrong[offset:offset + n])[0]
        chosen, _ = sample_elements(n, report.samples or 0, report.seed, k)
        if np.isin(changed, chosen).any():
            return True
        offset += n
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

