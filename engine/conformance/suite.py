"""One conformance run: forward over the chosen cases, then (optionally) the gradient sweep over
the forward-passing ones. Results are frozen values with a JSON form."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .cases import case_info, case_named
from .gradients import Checker, GradientOutcome, gradient_sweep
from .report import counts
from .runner import PASS, CaseOutcome, Executor, run_suite


@dataclass(frozen=True)
class ConformanceRun:
    outcomes: tuple[CaseOutcome, ...]
    gradients: tuple[GradientOutcome, ...] = ()
    forward_seconds: float = 0.0
    gradient_seconds: float = 0.0
    checker: str = ""

    @property
    def passed(self) -> int:
        return sum(o.status == PASS for o in self.outcomes)

    def to_json(self) -> dict:
        import collections

        import onnx

        return {
            "onnx": onnx.__version__,
            "cases": len(self.outcomes),
            "forward": counts(self.outcomes),
            "forward_seconds": round(self.forward_seconds, 3),
            "gradient": dict(collections.Counter(g.status for g in self.gradients)),
            "gradient_seconds": round(self.gradient_seconds, 3),
            "gradient_checker": self.checker,
            "outcomes": [o.to_json() for o in self.outcomes],
            "gradients": [g.to_json() for g in self.gradients],
        }


def default_checker() -> tuple[str, Checker]:
    """The verifier when it is importable, else the sweep's own finite differences."""
    from .verifier import available, verifier_check

    if available():
        return "engine.verify.check", verifier_check
    from .fd import fd_check

    return "engine.conformance.fd", fd_check


def sample_per_op(cases: Sequence, per_op: int, seed: int = 0) -> list:
    """At most `per_op` cases for each op under test (non-expanded first), chosen with a fixed seed."""
    rng = random.Random(seed)
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(case_info(c).op, []).append(c)
    chosen = []
    for op in sorted(by_op):
        group = by_op[op]
        direct = [c for c in group if not case_info(c).expanded]
        pool = direct if len(direct) >= per_op else group
        chosen.extend(rng.sample(pool, min(per_op, len(pool))))
    order = {c.name: k for k, c in enumerate(cases)}
    return sorted(chosen, key=lambda c: order[c.name])


def conformance(cases: Iterable | None = None, *, executor: Executor | None = None, gradients: bool = False,
                checker: Checker | None = None, gradient_filter: Callable[[list], list] | None = None,
                seed: int = 0, progress: Callable[[str, int, int, object], None] | None = None) -> ConformanceRun:
    """Forward over `cases` (all by default); with `gradients`, check the passing ones (optionally
    narrowed by `gradient_filter`, e.g. `lambda cs: sample_per_op(cs, 2)`)."""
    start = time.perf_counter()
    fwd = run_suite(cases, executor, None if progress is None else (lambda i, n, o: progress("forward", i, n, o)))
    forward_seconds = time.perf_counter() - start
    if not gradients:
        return ConformanceRun(tuple(fwd), forward_seconds=forward_seconds)
    name, chosen_checker = ("custom", checker) if checker is not None else default_checker()
    passing = [case_named(o.name) for o in fwd if o.status == PASS]
    if gradient_filter is not None:
        passing = gradient_filter(passing)
    start = time.perf_counter()
    grads = gradient_sweep(passing, chosen_checker, seed=seed,
                           progress=None if progress is None else (lambda i, n, o: progress("gradient", i, n, o)))
    return ConformanceRun(tuple(fwd), tuple(grads), forward_seconds, time.perf_counter() - start, name)
