"""The gradient sweep: every forward-passing node case with float inputs, each input the op's
schema tags differentiable, checked against float64 finite differences.

Which inputs and outputs: `onnx.defs.get_schema(op, opset, domain)`'s differentiation_category
(an `*_expanded` case uses its twin's node). Untagged ("Unknown") float inputs of an op are
checked too and reported as such. y is each differentiable float output in turn, with random dy.
"""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import onnx
from onnx.defs import OpSchema

from ..errors import OnnxGradError
from .cases import base_name, case_info, case_named
from .runner import normalize
from .status import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    NONFINITE,
    NOT_CHECKED,
    NOT_DIFFERENTIABLE,
    ONLY_DOCUMENTED,
    PASS,
    worse,
)
from .verifier import GradCheck, default_checker

# Where an op's derivative does not exist; an inconclusive verdict elsewhere is a finding.
KINKS = {
    "Abs": "x = 0", "Relu": "x = 0", "LeakyRelu": "x = 0", "PRelu": "x = 0", "Elu": "x = 0 (alpha != 1)",
    "Celu": "x = 0 (alpha != 1)", "Selu": "x = 0", "ThresholdedRelu": "x = alpha (a jump)",
    "HardSigmoid": "the ends of the linear segment", "HardSwish": "x = ±3", "Shrink": "x = ±lambd",
    "Clip": "x at min or max", "Max": "ties between inputs", "Min": "ties between inputs",
    "ReduceMax": "ties within a reduced slice", "ReduceMin": "ties within a reduced slice",
    "MaxPool": "ties within a window", "GlobalMaxPool": "ties within a channel", "MaxRoiPool": "ties",
    "ReduceL1": "x = 0", "ReduceL2": "all-zero slices", "LpNormalization": "x = 0 (p = 1), all-zero slices",
    "ScatterND": "ties (reduction max/min)", "ScatterElements": "ties (reduction max/min)",
    "LpPool": "x = 0 (p = 1)", "Mod": "jumps where x / y is an integer", "Sign": "x = 0 (a jump)",
    "TopK": "ties", "Sqrt": "x = 0", "Pow": "x = 0 with exponent < 1",
    "Resize": "pixel boundaries (nearest mode)", "GridSample": "pixel boundaries",
    "DynamicQuantizeLinear": "min/max ties and rounding steps",
    "DeformConv": "integer sampling positions (bilinear)", "RoiAlign": "integer sampling positions, max-mode ties",
    "Range": "an integer (limit - start) / delta, where the output's length jumps",
}


# Cases whose failure is understood and accepted, with the reason (regex on the case name).
# Anything failing that is not listed here is a bug to fix.
DOCUMENTED = {
    r"^test_attention_.*(fullymasked|nan_robustness|structural_empty|padded_kv|softmax_precision|"
    r"local_window_gqa_rank4_mask).*_expanded$":
        "a fully masked row: Softmax over all -inf gives NaN, which the function body hides with "
        "Where/IsNaN in the forward; reverse mode still multiplies that NaN by the zero gradient Where "
        "sends back (0 * NaN), the classic double-where problem; JAX and PyTorch autograd do the same",
    r"^test_acosh_example$": "x = 1 is the end of Acosh's domain, where its derivative is infinite",
}


def documented(name: str) -> str:
    for pattern, reason in DOCUMENTED.items():
        if re.search(pattern, base_name(name)):
            return reason
    return ""


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
    documented: str = ""  # why a fail / non-finite / error here is expected (see DOCUMENTED)
    seconds: float = 0.0
    evaluations: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "expanded": self.expanded, "status": self.status,
                "reason": self.reason, "xs": list(self.xs), "ys": list(self.ys), "untagged": self.untagged,
                "documented": self.documented, "seconds": round(self.seconds, 4), "evaluations": self.evaluations}


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
    inputs, expected = (normalize(list(v)) for v in case.data_sets[0])
    names = [i.name for i in case.model.graph.input][: len(inputs)]
    feeds = dict(zip(names, inputs))
    if any(isinstance(v, list) or v is None for v in list(feeds.values()) + list(expected)):
        return f"{NOT_CHECKED}: sequence or optional values"
    if not any(isinstance(v, np.ndarray) and v.size for v in expected):
        return f"{NOT_CHECKED}: every output is empty"
    cat = {name: _category(schema.inputs, i) for i, name in enumerate(node.input) if name}
    candidates = [n for n in names if _is_float_array(feeds[n]) and cat.get(n) not in (D.NonDifferentiable, None)]
    xs = [n for n in candidates if feeds[n].size]
    untagged = any(cat[n] == D.Unknown for n in xs)
    feeds = {n: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for n, v in feeds.items()}
    rng = np.random.default_rng(0)
    for n in names:  # edge-case data (inf, NaN) says nothing about a derivative: check at finite points
        if _is_float_array(feeds[n]) and not np.isfinite(feeds[n]).all():
            v = feeds[n].copy()
            bad = ~np.isfinite(v)
            v[bad] = rng.uniform(-1, 1, int(bad.sum())).astype(v.dtype)
            feeds[n] = v
    zs = [n for n in names if n not in xs]
    out_names = [o.name for o in case.model.graph.output]
    ys = [n for k, n in enumerate(out_names)
          if k < len(expected) and _is_float_array(expected[k]) and expected[k].size
          and _category(schema.outputs, k) != D.NonDifferentiable]
    if not xs:
        if candidates:
            return f"{NOT_CHECKED}: the differentiable inputs are empty"
        floats = any(_is_float_array(feeds[n]) for n in names)
        return f"{NOT_DIFFERENTIABLE}: {'the schema marks no float input differentiable' if floats else 'no float inputs'}"
    if not ys:
        return f"{NOT_DIFFERENTIABLE}: no differentiable float output"
    return xs, zs, ys, feeds, untagged


def check_case(case, checker: Checker | None = None, seed: int = 0) -> GradientOutcome:
    from .. import load

    checker = checker or default_checker()[1]
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
                    reason = f"d{y}: {res.reason}"
        except OnnxGradError as exc:
            status, reason = ERROR, str(exc).splitlines()[0][:300]
        except Exception as exc:  # an op without a working backward: a finding, not a crash
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            status, reason = ERROR, f"{type(exc).__name__}: {first}"[:300]
    note = ""
    if status in (FAIL, NONFINITE, ERROR):
        note = documented(case.name)
        if not note and status == NONFINITE and _has_nonfinite(case):
            note = "the case feeds or expects inf/NaN by design"
    return GradientOutcome(case.name, info.op, info.expanded, status, reason, tuple(xs), tuple(ys), untagged,
                           note, time.perf_counter() - start, evaluations)


def _has_nonfinite(case) -> bool:
    inputs, outputs = (normalize(list(v)) for v in case.data_sets[0])
    return any(_is_float_array(v) and not np.isfinite(v.astype(np.float64)).all() for v in list(inputs) + list(outputs))


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
    accepted = [o for o in checked if o.documented]
    checked = [o for o in checked if not o.documented]
    if not checked and accepted:
        return ONLY_DOCUMENTED, f"{_cases(len(accepted))}; {accepted[0].name}: {accepted[0].documented}"
    if not checked:
        if any(o.status == NOT_DIFFERENTIABLE for o in outcomes):
            return NOT_DIFFERENTIABLE, next(o.reason for o in outcomes if o.status == NOT_DIFFERENTIABLE)
        return NOT_CHECKED, outcomes[0].reason if outcomes else "no forward-passing case"
    status, note = _checked_status(checked, accepted)
    if all(o.expanded for o in checked):
        note += " (function body only: the expanded cases)"
    return status, note


def _cases(n: int) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"


def _checked_status(checked, accepted) -> tuple[str, str]:
    counts = {s: sum(o.status == s for o in checked) for s in (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR)}
    for s in (FAIL, NONFINITE, ERROR):
        if counts[s]:
            first = next(o for o in checked if o.status == s)
            return s, f"{counts[s]}/{len(checked)} cases; {first.name}: {first.reason}"
    if counts[INCONCLUSIVE]:
        kinds = sorted({inconclusive_kind(o.reason) for o in checked if o.status == INCONCLUSIVE})
        where = KINKS.get(checked[0].op.split("::")[-1])
        notes = [(f"at a kink ({where})" if where else "undocumented kink") if k == "kink" else k for k in kinds]
        return INCONCLUSIVE, (f"{counts[INCONCLUSIVE]}/{len(checked)} cases {', '.join(notes)}; "
                              f"{counts[PASS]} pass") + _also(accepted)
    return PASS, _cases(counts[PASS]) + _also(accepted)


def inconclusive_kind(reason: str) -> str:
    """Why finite differences could not decide, in a few words."""
    if "kink" in reason or "not differentiable here" in reason:
        return "kink"
    if "shape" in reason:
        return "shape jump"
    if "NaN or Inf near" in reason:
        return "near a NaN/Inf"
    if "not accurate enough" in reason or "error estimate" in reason:
        return "finite differences too inaccurate"
    return "other"


def _also(accepted) -> str:
    return f"; {len(accepted)} documented ({accepted[0].name})" if accepted else ""
