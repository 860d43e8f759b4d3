"""The lowering sweep: every node case whose gradient the engine computes, lowered to plain ONNX
(`engine.lower`) and run by onnxruntime, against the engine's own gradients.

Per case: xs, zs and the ys are the gradient sweep's (`gradients.selection_for`: the float inputs
the schema tags differentiable); each y is lowered with a seeded random `dy` input, the lowered
model must pass onnx's full checker and strict shape inference, and onnxruntime's gradients must
equal the engine's in the case's own element type to `TOL` of the gradient's scale (the tolerance
of tests/lowering/test_lower.py: `max |ort - engine| <= TOL * max(1, max |engine|)`).
"""
from __future__ import annotations

import collections
import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
from onnx import TensorProto

from ..errors import LoweringError, OnnxGradError
from .cases import case_info, tolerances
from .runner import normalize
from .status import (
    ERROR,
    LOWERED,
    NOT_APPLICABLE,
    ONLY_DOCUMENTED,
    REFUSED,
    RUNTIME,
    WRONG,
)

TOL = 1e-5  # float32 and float64
TOLS = {TensorProto.FLOAT16: 5e-3, TensorProto.BFLOAT16: 4e-2}  # a few units in the last place


# Disagreements understood and accepted (regex on the case name -> why); any other one is a bug. None:
# Attention's fully masked rows have a rule of their own (engine/lowering/attention.py).
DOCUMENTED: dict[str, str] = {}


def documented(name: str) -> str:
    return next((why for pattern, why in DOCUMENTED.items() if re.search(pattern, name)), "")


@dataclass(frozen=True)
class LoweringOutcome:
    name: str
    op: str
    expanded: bool
    status: str
    reason: str = ""
    error: float = 0.0  # the worst scaled |ort - engine| over the case's gradients
    nodes: int = 0  # nodes of the (last) lowered model
    seconds: float = 0.0
    documented: str = ""  # why a wrong result here is expected (DOCUMENTED)

    @property
    def applicable(self) -> bool:
        return self.status != NOT_APPLICABLE

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "expanded": self.expanded, "status": self.status,
                "reason": self.reason, "error": self.error, "nodes": self.nodes, "seconds": round(self.seconds, 4),
                "documented": self.documented}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def _session(proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ort_run(proto, feeds: dict) -> dict:
    """onnxruntime's outputs; bfloat16 goes in and out as OrtValues (its numpy API has no bfloat16)."""
    import ml_dtypes
    import onnxruntime as ort

    wide = [o for o in proto.graph.output if o.type.tensor_type.elem_type == TensorProto.BFLOAT16]
    if wide:  # read bfloat16 outputs through a Cast to float32
        proto = _with_float_outputs(proto, wide)
    session = _session(proto)
    values = {}
    for i in session.get_inputs():
        if i.name not in feeds:
            continue
        v = np.asarray(feeds[i.name])
        if i.type == "tensor(bfloat16)":
            values[i.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.array(v.astype(ml_dtypes.bfloat16).view(np.uint16), order="C"), TensorProto.BFLOAT16)
        else:
            values[i.name] = ort.OrtValue.ortvalue_from_numpy(np.array(v, order="C"))  # 0-d stays 0-d
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, (v.numpy() for v in session.run_with_ort_values(names, values))))


def _with_float_outputs(proto, outputs):
    from onnx import ModelProto, helper

    out = ModelProto()
    out.CopyFrom(proto)
    for o in outputs:
        inner = f"{o.name}/bfloat16"
        for n in out.graph.node:
            n.output[:] = [inner if t == o.name else t for t in n.output]
            n.input[:] = [inner if t == o.name else t for t in n.input]
        out.graph.node.append(helper.make_node("Cast", [inner], [o.name], to=TensorProto.FLOAT))
        vi = next(v for v in out.graph.output if v.name == o.name)
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
    return out


def scaled_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    same = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))  # NaN and inf where expected
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got - want))
    if np.isnan(diff).any():
        return float("inf")
    finite = np.abs(want[np.isfinite(want)])
    return float(diff.max(initial=0.0) / max(1.0, finite.max(initial=0.0)))


def lower_case(case, seed: int = 0) -> LoweringOutcome:
    """Lower one case's gradients, run them in onnxruntime, compare with the engine."""
    from .. import load
    from .gradients import selection_for

    info = case_info(case)
    start = time.perf_counter()

    def outcome(status: str, reason: str = "", error: float = 0.0, nodes: int = 0) -> LoweringOutcome:
        why = documented(case.name) if status == WRONG and error == float("inf") else ""
        return LoweringOutcome(case.name, info.op, info.expanded, status, reason, error, nodes,
                               time.perf_counter() - start, why)

    sel = selection_for(case)
    if isinstance(sel, str):
        return outcome(NOT_APPLICABLE, sel)
    xs, zs, ys, feeds, _ = sel
    expected = dict(zip([o.name for o in case.model.graph.output], normalize(list(case.data_sets[0][1]))))
    rng = np.random.default_rng(seed)
    worst, nodes = 0.0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = load(case.model, check=False)
        except Exception as exc:  # noqa: BLE001 - the forward sweep reports load failures
            return outcome(NOT_APPLICABLE, f"the engine cannot load it: {_one_line(exc)}")
        for k, y in enumerate(ys):
            try:
                y_value = np.asarray(expected[y])  # its shape and type: the engine computes it (forward pass)
                dy = rng.standard_normal(y_value.shape).astype(np.float32 if y_value.dtype.name == "bfloat16"
                                                                 else y_value.dtype)
                want = model.gradient(y, xs, zs, feeds=feeds, dy=dy).grads
            except Exception as exc:  # noqa: BLE001 - the gradient sweep reports the engine's own failures
                return outcome(NOT_APPLICABLE, f"the engine computes no gradient of {y}: {_one_line(exc)}")
            names = [f"lowered_d{k}_{i}" for i in range(len(xs))]
            stop, got, nodes = _lowered_run(case, k, y, xs, zs, feeds, dy, names)
            if stop:
                return outcome(*stop)
            if random_draws(case, feeds):
                continue  # the engine and onnxruntime draw different numbers: ran, not compared
            stop, worst = _compared(case, model, feeds, y, xs, names, got, want, worst)
            if stop:
                return outcome(*stop, nodes)
    return outcome(LOWERED, "random op: lowered and run, values not compared" if random_draws(case, feeds) else "",
                   worst, nodes)


def _lowered_run(case, k: int, y: str, xs, zs, feeds: dict, dy, names: list[str]):
    """(stop, onnxruntime's outputs, nodes): dy/dxs lowered (checked by onnx) and run by onnxruntime;
    `stop` is None, or what `lower_case` reports (status, reason, error, nodes) when that fails."""
    from ..lowering import lower

    try:
        lowered = lower(case.model, y, xs, zs, dy=f"lowered_dy{k}", names=names)
    except LoweringError as exc:
        return (REFUSED, _one_line(exc)), None, 0
    except Exception as exc:  # noqa: BLE001 - a rule that crashes is a bug to list, not a crash
        return (ERROR, f"lowering raised {type(exc).__name__}: {_one_line(exc)}"), None, 0
    nodes = len(lowered.graph.node)
    problem = invalid(lowered)
    if problem:
        return (ERROR, problem, 0.0, nodes), None, nodes
    try:
        return None, _ort_run(lowered, {**feeds, f"lowered_dy{k}": dy}), nodes
    except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal, classified below
        try:
            _ort_run(case.model, feeds)
        except Exception as forward_exc:  # noqa: BLE001
            return (RUNTIME, f"onnxruntime cannot run the forward case: {_one_line(forward_exc)}"), None, nodes
        if "NOT_IMPLEMENTED" in str(exc):  # a standard op onnxruntime has no kernel for (e.g. in bfloat16)
            return (RUNTIME, f"onnxruntime: {_one_line(exc)}", 0.0, nodes), None, nodes
        return (ERROR, f"onnxruntime: {_one_line(exc)}", 0.0, nodes), None, nodes


def _compared(case, model, feeds: dict, y: str, xs, names: list[str], got: dict, want: dict, worst: float):
    """(stop, worst): onnxruntime's y and dy/dxs against the engine's; `stop` is None, or what
    `lower_case` reports (status, reason, error) when they differ; `worst` the largest scaled error."""
    forward = _compare_forward(case, got.get(y), model.run(feeds, outputs=[y])[y])
    if forward and not _unlowered_gives(case, feeds, y, got.get(y)):
        return (WRONG, f"the lowered model's {y}: {forward}", worst), worst
    for x, name in zip(xs, names):
        err = scaled_error(got[name], want[x])
        worst = max(worst, err)
        tol = TOLS.get(_elem_type(case.model, x), TOL)
        if not err <= tol:
            differs = forward_differs(case)
            if differs:
                return (RUNTIME, f"onnxruntime's forward differs from the case's: {differs}", worst), worst
            return (WRONG, f"d{y}/d{x}: scaled error {err:.3g} > {tol:g}", worst), worst
    return None, worst


def random_draws(case, feeds) -> bool:
    """Whether the case draws random numbers (a random op, Dropout in training mode)."""
    from .runner import RANDOM_OPS

    for n in case.model.graph.node:
        if n.op_type in RANDOM_OPS:
            return True
        if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2] in feeds and bool(np.asarray(feeds[n.input[2]])):
            return True
    return False


def forward_differs(case) -> str:
    """'' when onnxruntime computes the case's expected outputs (or cannot run the case at all), else where
    it does not (its own semantics then also run the lowered graph: a gradient against the engine's is
    meaningless)."""
    from .compare import compare
    from .runner import normalize

    inputs, expected = (normalize(list(v)) for v in case.data_sets[0])
    names = [i.name for i in case.model.graph.input][: len(inputs)]
    try:
        got = _ort_run(case.model, dict(zip(names, inputs)))
    except Exception:  # noqa: BLE001 - it cannot run the case at all (no kernel): the lowered model is judged alone
        return ""
    rtol, atol = tolerances(case)
    for o, want in zip(case.model.graph.output, expected):
        problem = compare(got.get(o.name), want, rtol, atol, check_dtype=False)
        if problem:
            return f"{o.name}: {problem}"
    return ""


def _compare_forward(case, got, want) -> str:
    """'' when onnxruntime's y from the lowered model is the engine's y at the same feeds (to the case's
    tolerances), else how it differs: lowering may write forward nodes out (engine/lowering/portable.py), and
    the engine's forward is checked against the case's expected outputs by the forward sweep."""
    from .compare import compare

    rtol, atol = tolerances(case)
    return compare(got, want, rtol, atol, check_dtype=False) or ""


def _unlowered_gives(case, feeds, y: str, got) -> bool:
    """Whether onnxruntime runs the case itself and gives the lowered model's y: then a difference from the
    engine is onnxruntime's own forward (its kernel), which lowering kept as it was."""
    try:
        unlowered = _ort_run(case.model, feeds).get(y)
    except Exception:  # noqa: BLE001 - it cannot: the lowered forward is lowering's own writing
        return False
    return not _compare_forward(case, got, unlowered)


def _elem_type(model, name: str) -> int:
    return next((i.type.tensor_type.elem_type for i in model.graph.input if i.name == name), TensorProto.FLOAT)


def invalid(lowered) -> str:
    """'' when the lowered model passes onnx's full checker and strict shape inference, else why not."""
    import onnx

    try:
        onnx.checker.check_model(lowered, full_check=True)
        onnx.shape_inference.infer_shapes(lowered, check_type=True, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - any checker complaint is the finding
        return f"invalid lowered model: {_one_line(exc)}"
    return ""


def lowering_sweep(cases: Iterable, *, seed: int = 0,
                   progress: Callable[[int, int, LoweringOutcome], None] | None = None) -> list[LoweringOutcome]:
    cases = list(cases)
    out = []
    for i, case in enumerate(cases):
        try:
            out.append(lower_case(case, seed))
        except OnnxGradError as exc:
            out.append(LoweringOutcome(case.name, case_info(case).op, case_info(case).expanded, ERROR, _one_line(exc)))
        if progress is not None:
            progress(i + 1, len(cases), out[-1])
    return out


def op_lowering_status(outcomes: Iterable[LoweringOutcome]) -> tuple[str, str]:
    """(status, note) for one op from its cases: wrong > error > refused > runtime lacks op > lowered;
    a documented wrong case is named, not counted as wrong."""
    applicable = [o for o in outcomes if o.applicable]
    if not applicable:
        return "", ""
    accepted = [o for o in applicable if o.documented]
    checked = [o for o in applicable if not o.documented]
    also = f"; documented: {accepted[0].name}" if accepted else ""
    for status in (WRONG, ERROR, REFUSED, RUNTIME):
        bad = [o for o in checked if o.status == status]
        if bad:
            lowered = sum(o.status == LOWERED for o in checked)
            return status, f"{len(bad)}/{len(checked)} {status}, {lowered} lowered; {bad[0].name}: {bad[0].reason}{also}"
    return (LOWERED, also[2:]) if checked else (ONLY_DOCUMENTED, f"{accepted[0].name}: {accepted[0].documented}")


def sweep_record(outcomes, previous: dict | None = None) -> dict:
    """What tests/lowering_floor.json keeps of a full sweep: totals, the docs/ops.md cell of every op, and
    the cases that lowered and matched (which must keep doing so); refuses to drop a recorded case."""
    import onnx

    lowered = sorted(o.name for o in outcomes if o.status == LOWERED)
    if previous:
        lost = sorted(set(previous.get("lowered", [])) - set(lowered))
        if lost:
            raise ValueError(f"{len(lost)} recorded cases no longer lower, e.g. {lost[:5]}")
    by_op: dict[str, list[LoweringOutcome]] = {}
    for o in outcomes:
        by_op.setdefault(o.op, []).append(o)
    cells = {op: op_lowering_status(group) for op, group in sorted(by_op.items())}
    applicable = [o for o in outcomes if o.applicable]
    return {
        "onnx": onnx.__version__,
        "summary": {"applicable": len(applicable),
                    **dict(sorted(collections.Counter(o.status for o in applicable).items())),
                    "documented": sum(bool(o.documented) for o in applicable)},
        "wrong_or_error_max": sum(o.status in (WRONG, ERROR) and not o.documented for o in outcomes),
        "ops": {op: [status, note[:200]] for op, (status, note) in cells.items() if status},
        "lowered": lowered,
    }


def lowering_column(record: dict):
    """The *lowered* column of docs/ops.md, from a recorded full sweep (`sweep_record`)."""
    from .report import Column

    counts = dict(record["summary"])
    applicable, lowered = counts.pop("applicable"), counts.pop(LOWERED, 0)
    documented = counts.pop("documented", 0)
    rest = "".join(f", {n} {s}" + (f" ({documented} documented)" if s == WRONG and documented else "")
                   for s, n in counts.items() if n)
    summary = (f"Lowered (`engine.lower`, run by onnxruntime, against the engine's gradients; every case whose "
               f"gradient the engine computes): {lowered} of {applicable}{rest}.")
    legend = ("*lowered* is `onnxgrad conformance --lower` over every forward-passing case whose gradient the "
              "engine computes, run by onnxruntime and compared with the engine: `lowered`, `refused` (one line "
              "says why), `wrong`, `error`, `runtime lacks op` (onnxruntime cannot run the case, or the ops the "
              "backward needs); see [lowering](lowering.md).")
    return Column("lowered", legend, summary, {op: tuple(cell) for op, cell in record["ops"].items()})
