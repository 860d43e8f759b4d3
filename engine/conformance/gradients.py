"""The gradient sweep: every forward-passing node case with float inputs, each input the op's
schema tags differentiable, checked against float64 finite differences.

Which inputs and outputs: `onnx.defs.get_schema(op, opset, domain)`'s differentiation_category
(an `*_expanded` case uses its twin's node). Untagged ("Unknown") float inputs of an op are
checked too and reported as such. y is each differentiable float output in turn, with random dy.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import onnx
from onnx.defs import OpSchema

from ..errors import OnnxGradError
from .cases import case_info, case_named
from .fd import FAIL, INCONCLUSIVE, NONFINITE, PASS, GradCheck, fd_check, worse

NOT_DIFFERENTIABLE, NOT_CHECKED, ERROR = "not differentiable", "not checked", "error"
GRADIENT_STATUSES = (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR, NOT_DIFFERENTIABLE, NOT_CHECKED)

# Where an op's derivative does not exist; an inconclusive verdict elsewhere is a finding.
KINKS = {
    "Abs": "x = 0", "Relu": "x = 0", "LeakyRelu": "x = 0", "PRelu": "x = 0", "Elu": "x = 0 (alpha != 1)",
    "Celu": "x = 0 (alpha != 1)", "Selu": "x = 0", "ThresholdedRelu": "x = alpha (a jump)",
    "HardSigmoid": "the ends of the linear segment", "HardSwish": "x = ±3", "Shrink": "x = ±lambd",
    "Clip": "x at min or max", "Max": "ties between inputs", "Min": "ties between inputs",
    "ReduceMax": "ties within a reduced slice", "ReduceMin": "ties within a reduced slice",
    "MaxPool": "ties within a window", "GlobalMaxPool": "ties within a channel", "MaxRoiPool": "ties",
    "ReduceL1": "x = 0", "ReduceL2": "all-zero slices", "LpNormalization": "all-zero slices",
    "LpPool": "x = 0 (p = 1)", "Mod": "jumps where x / y is an integer", "Sign": "x = 0 (a jump)",
    "TopK": "ties", "Where": "none in x/y", "Sqrt": "x = 0", "Pow": "x = 0 with exponent < 1",
    "Resize": "pixel boundaries (nearest mode)", "GridSample": "pixel boundaries",
    "Softplus": "none", "Mish": "none",
}


@dataclass(frozen=True)
class GradientOutcome:
    name: str
    op: str
    expanded: bool
    status: str
    reason: str = ""
    xs: tuple[str, ...] = ()
    ys: tuple[str, ...] = ()
    untagged: bool = False  # the schema leaves the inputs' differentiability Unknown
    seconds: float = 0.0
    evaluations: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "expanded": self.expanded, "status": self.status,
                "reason": self.reason, "xs": list(self.xs), "ys": list(self.ys), "untagged": self.untagged,
                "seconds": round(self.seconds, 4), "evaluations": self.evaluations}


Checker = Callable[..., GradCheck]


def _category(params, i: int):
    if not params:
        return None
    if i >= len(params):
        last = params[-1]
        return last.differentiation_category if last.option == OpSchema.FormalParameterOption.Variadic else None
    return params[i].differentiation_category


def _is_float_array(v) -> bool:
    return isinstance(v, np.ndarray) and (v.dtype.kind == "f" or v.dtype.name == "bfloat16")


def selection_for(case) -> tuple[list[str], list[str], list[str], dict, bool] | str:
    """(xs, zs, ys, feeds, untagged) for the case's first data set, or why there is nothing to check."""
    info = case_info(case)
    source = case_named(info.twin) if info.expanded else case
    node = source.model.graph.node[0]
    try:
        schema = onnx.defs.get_schema(node.op_type, info.opset, node.domain or "")
    except Exception:
        return f"{NOT_CHECKED}: no schema for {info.op} opset {info.opset}"
    D = OpSchema.DifferentiationCategory
    inputs, expected = case.data_sets[0]
    names = [i.name for i in case.model.graph.input][: len(inputs)]
    feeds = dict(zip(names, inputs))
    if any(isinstance(v, list) or v is None for v in feeds.values()):
        return f"{NOT_CHECKED}: sequence or optional values"
    cat = {name: _category(schema.inputs, i) for i, name in enumerate(node.input) if name}
    untagged = False
    xs = []
    for n in names:
        c = cat.get(n)
        if not _is_float_array(feeds[n]) or c == D.NonDifferentiable or c is None:
            continue
        untagged = untagged or c == D.Unknown
        xs.append(n)
    feeds = {n: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for n, v in feeds.items()}
    zs = [n for n in names if n not in xs]
    out_names = [o.name for o in case.model.graph.output]
    ys = [n for k, n in enumerate(out_names)
          if k < len(expected) and _is_float_array(expected[k])
          and _category(schema.outputs, k) != D.NonDifferentiable]
    if not xs:
        floats = [n for n in names if _is_float_array(feeds[n])]
        why = "the schema marks no float input differentiable" if floats else "no float inputs"
        return f"{NOT_DIFFERENTIABLE}: {why}"
    if not ys:
        return f"{NOT_DIFFERENTIABLE}: no differentiable float output"
    return xs, zs, ys, feeds, untagged


def check_case(case, checker: Checker | None = None, seed: int = 0) -> GradientOutcome:
    from .. import load

    checker = checker or fd_check
    info = case_info(case)
    start = time.perf_counter()
    sel = selection_for(case)
    if isinstance(sel, str):
        status, _, reason = sel.partition(": ")
        return GradientOutcome(case.name, info.op, info.expanded, status, reason,
                               seconds=time.perf_counter() - start)
    xs, zs, ys, feeds, untagged = sel
    status, reason, evaluations = PASS, "", 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = load(case.model, check=False)
            for k, y in enumerate(ys):
                res = checker(model, y, xs, zs, feeds, seed=seed + k)
                evaluations += res.evaluations
                if worse(res.status, status) != status or (res.status == status and not reason and res.reason):
                    status = worse(res.status, status)
                    reason = f"d{y}: {res.reason}" + (f" at {res.worst}" if res.worst else "")
        except OnnxGradError as exc:
            status, reason = ERROR, str(exc).splitlines()[0][:300]
        except Exception as exc:  # an op without a working backward: a finding, not a crash
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            status, reason = ERROR, f"{type(exc).__name__}: {first}"[:300]
    return GradientOutcome(case.name, info.op, info.expanded, status, reason, tuple(xs), tuple(ys), untagged,
                           time.perf_counter() - start, evaluations)


def gradient_sweep(cases: Iterable, checker: Checker | None = None, *, seed: int = 0,
                   progress: Callable[[int, int, GradientOutcome], None] | None = None) -> list[GradientOutcome]:
    """Check the given cases (pass only forward-passing ones: a wrong forward makes FD meaningless)."""
    cases = list(cases)
    out = []
    for i, case in enumerate(cases):
        out.append(check_case(case, checker, seed))
        if progress is not None:
            progress(i + 1, len(cases), out[-1])
    return out


def op_gradient_status(outcomes: Iterable[GradientOutcome]) -> tuple[str, str]:
    """(status, note) for one op from its cases: fail > non-finite > error > inconclusive > pass."""
    outcomes = list(outcomes)
    checked = [o for o in outcomes if o.status in (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR)]
    if not checked:
        if any(o.status == NOT_DIFFERENTIABLE for o in outcomes):
            return NOT_DIFFERENTIABLE, next(o.reason for o in outcomes if o.status == NOT_DIFFERENTIABLE)
        return NOT_CHECKED, outcomes[0].reason if outcomes else "no forward-passing case"
    counts = {s: sum(o.status == s for o in checked) for s in (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR)}
    for s in (FAIL, NONFINITE, ERROR):
        if counts[s]:
            first = next(o for o in checked if o.status == s)
            return s, f"{counts[s]}/{len(checked)} cases; {first.name}: {first.reason}"
    if counts[INCONCLUSIVE]:
        op = checked[0].op.split("::")[-1]
        where = KINKS.get(op)
        note = f"at a kink ({where})" if where else "undocumented kink"
        return INCONCLUSIVE, f"{counts[INCONCLUSIVE]}/{len(checked)} cases {note}, {counts[PASS]} pass"
    return PASS, f"{counts[PASS]} cases"
