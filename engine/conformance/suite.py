"""One conformance run: forward over the chosen cases, then (optionally) the gradient sweep over
the forward-passing ones. Results are frozen values with a JSON form."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .cases import case_info, case_named, node_cases
from .gradients import Checker, GradientOutcome, gradient_sweep
from .jvps import JVPOutcome, jvp_column, jvp_sweep
from .lowered import LoweringOutcome, lowering_column, lowering_sweep
from .report import counts
from .runner import PASS, CaseOutcome, Executor, run_suite
from .verifier import default_checker


@dataclass(frozen=True)
class ConformanceRun:
    outcomes: tuple[CaseOutcome, ...]
    gradients: tuple[GradientOutcome, ...] = ()
    forward_seconds: float = 0.0
    gradient_seconds: float = 0.0
    checker: str = ""
    lowered: tuple[LoweringOutcome, ...] = ()  # the lowering sweep (engine/conformance/lowered.py)
    lowered_seconds: float = 0.0
    jvps: tuple[JVPOutcome, ...] = ()  # the forward-mode sweep (engine/conformance/jvps.py)
    jvp_seconds: float = 0.0

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
            "lowered": dict(collections.Counter(o.status for o in self.lowered)),
            "lowered_seconds": round(self.lowered_seconds, 3),
            "lowerings": [o.to_json() for o in self.lowered],
            "jvp": dict(collections.Counter(j.status for j in self.jvps)),
            "jvp_seconds": round(self.jvp_seconds, 3),
            "jvps": [j.to_json() for j in self.jvps],
        }


def sample_per_op(cases: Sequence, per_op: int, seed: int = 0) -> list:
    """At most `per_op` cases for each op under test (non-expanded first), chosen with a fixed seed.

    Each op's choice depends only on its own cases (a seeded hash of the case name), so a case
    that starts passing for one op never reshuffles the sample of another.
    """
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(case_info(c).op, []).append(c)
    chosen = []
    for op in sorted(by_op):
        group = by_op[op]
        direct = [c for c in group if not case_info(c).expanded]
        pool = direct if len(direct) >= per_op else group
        pool = sorted(pool, key=lambda c: hashlib.sha256(f"{seed}:{c.name}".encode()).hexdigest())
        chosen.extend(pool[:per_op])
    order = {c.name: k for k, c in enumerate(cases)}
    return sorted(chosen, key=lambda c: order[c.name])


def conformance(cases: Iterable | None = None, *, executor: Executor | None = None, gradients: bool = False,
                checker: Checker | None = None, gradient_filter: Callable[[list], list] | None = None,
                seed: int = 0, progress: Callable[[str, int, int, object], None] | None = None,
                lower: bool = False, lower_filter: Callable[[list], list] | None = None,
                jvp: bool = False) -> ConformanceRun:
    """Forward over `cases` (all by default); with `gradients`, check the passing ones (optionally
    narrowed by `gradient_filter`, e.g. `lambda cs: sample_per_op(cs, 2)`) against finite differences;
    with `jvp`, check the same ones' J·v (forward mode, and its transpose against reverse mode);
    with `lower`, lower the passing ones (narrowed by `lower_filter`) and run them in onnxruntime."""
    start = time.perf_counter()
    cases = list(node_cases() if cases is None else cases)
    fwd = run_suite(cases, executor, None if progress is None else (lambda i, n, o: progress("forward", i, n, o)))
    forward_seconds = time.perf_counter() - start
    if not (gradients or lower or jvp):
        return ConformanceRun(tuple(fwd), forward_seconds=forward_seconds)
    by_name = {c.name: c for c in cases}
    every = [by_name[o.name] for o in fwd if o.status == PASS]
    passing = gradient_filter(every) if gradient_filter is not None else every
    grads, name, gradient_seconds = [], "", 0.0
    if gradients:
        name, chosen_checker = ((getattr(checker, "__name__", "custom"), checker) if checker is not None
                                else default_checker())
        start = time.perf_counter()
        grads = gradient_sweep(passing, chosen_checker, seed=seed,
                               progress=None if progress is None else (lambda i, n, o: progress("gradient", i, n, o)))
        gradient_seconds = time.perf_counter() - start
    lowered, lowered_seconds = [], 0.0
    if lower:
        start = time.perf_counter()
        lowered = lowering_sweep(lower_filter(every) if lower_filter is not None else passing, seed=seed,
                                 progress=None if progress is None else (lambda i, n, o: progress("lowering", i, n, o)))
        lowered_seconds = time.perf_counter() - start
    jvps, jvp_seconds = [], 0.0
    if jvp:
        start = time.perf_counter()
        jvps = jvp_sweep(passing, seed=seed,
                         progress=None if progress is None else (lambda i, n, o: progress("jvp", i, n, o)))
        jvp_seconds = time.perf_counter() - start
    return ConformanceRun(tuple(fwd), tuple(grads), forward_seconds, gradient_seconds, name, tuple(lowered),
                          lowered_seconds, tuple(jvps), jvp_seconds)


DOC_GRADIENT_SAMPLE = 2  # gradient cases per op in docs/ops.md and in CI (seeded, non-expanded first)
CI_LOWERING_SAMPLE = 1  # lowered cases per op that CI re-runs (each is a model onnxruntime loads: ~0.1 s)
DOC_SEED = 0


def doc_run(progress=None) -> ConformanceRun:
    """The run docs/ops.md is generated from (and that CI repeats): every case forward, a per-op sample of gradients."""
    return conformance(gradients=True, seed=DOC_SEED, progress=progress,
                       gradient_filter=lambda cs: sample_per_op(cs, DOC_GRADIENT_SAMPLE, DOC_SEED))


def lowering_sample(passing: Iterable[str], progress=None) -> list[LoweringOutcome]:
    """The lowering sweep over CI_LOWERING_SAMPLE of the given forward-passing cases per op."""
    cases = sample_per_op([case_named(n) for n in passing], CI_LOWERING_SAMPLE, DOC_SEED)
    return lowering_sweep(cases, seed=DOC_SEED, progress=progress)


def render_ops_doc(run: ConformanceRun | None = None, lowering: dict | None = None, jvp: dict | None = None) -> str:
    """docs/ops.md from a doc run (forward, gradient sample), the recorded full lowering sweep
    (tests/lowering_floor.json, `sweep_record`) and the recorded full JVP sweep (tests/jvp_floor.json,
    `jvp_record`)."""
    import onnx

    from .report import coverage, ops_markdown

    run = run or doc_run()
    header = (f"Generated by `python scripts/gen_ops_doc.py` from onnx {onnx.__version__}'s "
              f"{len(run.outcomes)} node test cases (`onnx.backend.test.case.node.collect_testcases`); "
              "do not edit by hand, CI checks it is current. Gradient statuses come from a seeded sample of "
              f"up to {DOC_GRADIENT_SAMPLE} forward-passing cases per op (`{run.checker}`, float64 central "
              "differences, random dy); `onnxgrad conformance --gradients` checks every case. Lowering statuses "
              "come from `onnxgrad conformance --lower` over every case (`python scripts/gen_ops_doc.py --lower`); "
              "JVP statuses from `onnxgrad conformance --gradients --jvp` over every case "
              "(`python scripts/gen_ops_doc.py --jvp`).")
    columns = ([jvp_column(jvp)] if jvp else []) + ([lowering_column(lowering)] if lowering else [])
    return ops_markdown(coverage(run.outcomes, run.gradients), run.outcomes, run.gradients, header, columns)
