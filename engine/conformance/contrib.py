"""The com.microsoft sweep: generated single-node cases of onnxruntime's contrib ops (contrib_cases.py),
forward against onnxruntime's CPU kernels in float32 and float16, gradients against float64 finite
differences (`onnxgrad conformance --contrib`).

Where onnxruntime has no CPU kernel (BiasAdd, BiasSplitGelu, GemmFastGelu run on CUDA/ROCm only) the
oracle is the op's definition written with ai.onnx ops, run by onnxruntime. Tolerances are
onnxruntime's OpTester ones: float32 relative 1e-4, absolute 1e-5; float16 relative and absolute
5e-3; the absolute part scales with the output's largest magnitude (sums of products cancel).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
from onnx import helper

from ..errors import OnnxGradError, UnsupportedOpError
from .contrib_case import MS, ContribCase
from .gradients import GradientOutcome
from .runner import CaseOutcome
from .status import ERROR, FAIL, MISMATCH, NO_ORACLE, NOT_DIFFERENTIABLE, PASS, UNSUPPORTED_OP, worse
from .verifier import default_checker

TOLERANCES = {"float32": (1e-4, 1e-5), "float16": (5e-3, 5e-3)}
UNINFERRED_OUTPUTS = frozenset({"qk"})


def _value_info(name, value):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


def node_model(op, domain, inputs: Sequence, attrs: dict, outputs: Sequence[str], opset: int, feeds: dict,
               out_values: Sequence | None = None, name: str = "case"):
    """A one-node model; outputs typed from `out_values` when given (the engine's checker wants them)."""
    node = helper.make_node(op, [n if v is not None else "" for n, v in inputs], list(outputs), domain=domain,
                            **attrs)
    graph_inputs = [_value_info(n, feeds[n]) for n, v in inputs if v is not None]
    if out_values is None:
        # onnxruntime cannot infer MultiHeadAttention's qk type: it is typed like the float inputs
        floats = [v.dtype for v in feeds.values() if v.dtype.kind == "f"]
        graph_outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(floats[0]), None)
                         if n in UNINFERRED_OUTPUTS and floats else helper.make_empty_tensor_value_info(n)
                         for n in outputs]
    else:
        graph_outputs = [_value_info(n, np.asarray(v)) for n, v in zip(outputs, out_values)]
    graph = helper.make_graph([node], name.replace("/", "_"), graph_inputs, graph_outputs)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def case_model(case: ContribCase, dtype: str = "float32", out_values=None):
    return node_model(case.op, case.domain, case.inputs, dict(case.attrs), case.outputs, case.opset,
                      case.feeds(dtype), out_values, case.name)


def onnxruntime_outputs(model, feeds: dict) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def expected(case: ContribCase, dtype: str) -> list:
    feeds = case.feeds(dtype)
    model = case.reference(case, dtype) if case.reference is not None else case_model(case, dtype)
    return onnxruntime_outputs(model, feeds)


def differs(got, want, dtype: str) -> str:
    """'' when `got` matches onnxruntime's `want` within the dtype's tolerance, else where and by how much."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != onnxruntime's {want.shape}"
    if got.dtype != want.dtype:
        return f"element type {got.dtype} != onnxruntime's {want.dtype}"
    if want.dtype.kind not in "fc":
        bad = got != want
        return f"{int(bad.sum())}/{bad.size} values differ" if bad.any() else ""
    rtol, atol = TOLERANCES[dtype]
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w) & (np.abs(w) < 1e30)  # the kernels' lowest-float masks are not magnitudes
    scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - w)
        ok = (err <= atol * scale + rtol * np.abs(w)) | (np.isnan(g) & np.isnan(w)) | (g == w)
    if ok.all():
        return ""
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(~ok)), ok.shape))
    return (f"{int((~ok).sum())}/{ok.size} values differ (max |diff| {np.nanmax(err):.3g}; first at {at}: "
            f"{g[at]:.6g} vs onnxruntime {w[at]:.6g})")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_forward(case: ContribCase, dtype: str = "float32") -> CaseOutcome:
    from .. import load

    name = case.name if dtype == "float32" else f"{case.name}@{dtype}"
    start = time.perf_counter()

    def outcome(status, message=""):
        return CaseOutcome(name, (case.op,), status, message, case.op, False, time.perf_counter() - start)

    try:
        want = expected(case, dtype)
    except Exception as exc:  # onnxruntime refuses this form: nothing to compare with
        return outcome(NO_ORACLE, "onnxruntime: " + _one_line(exc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = load(case_model(case, dtype, want))
            got = model.run(case.feeds(dtype))
        except UnsupportedOpError as exc:
            return outcome(UNSUPPORTED_OP, _one_line(exc))
        except Exception as exc:
            return outcome(ERROR, _one_line(exc))
    for out, w in zip(case.outputs, want):
        problem = differs(got[out], w, dtype)
        if problem:
            return outcome(MISMATCH, f"{out}: {problem}")
    return outcome(PASS)


def _float_outputs(case: ContribCase, values) -> list[str]:
    return [n for n, v in zip(case.outputs, values) if np.asarray(v).dtype.kind == "f" and np.asarray(v).size]


def _straight_through(model, case, y, feeds, seed) -> tuple[str, str]:
    """dA of a straight-through x against the float product's gradient dy · dequant(B)ᵀ, computed here."""
    from .contrib_oracles import straight_through_gradient

    rng = np.random.default_rng(seed)
    y0 = model.run(feeds, outputs=[y], dtype="float64")[y]
    dy = rng.standard_normal(np.shape(y0))
    names = list(case.straight_through)
    others = [n for n in feeds if n not in names]
    got = model.gradient(y, names, others, feeds, dy=dy, dtype="float64").grads
    for n in names:
        want = straight_through_gradient(case, n, dy)
        err = float(np.abs(got[n] - want).max())
        if err > 1e-8 * max(1.0, float(np.abs(want).max())):
            return FAIL, f"d{y}/d{n}: straight-through gradient off by {err:.3g}"
    return PASS, ""


def run_gradient(case: ContribCase, seed: int = 0, checker=None) -> GradientOutcome:
    from .. import load

    checker = checker or default_checker()[1]
    start = time.perf_counter()
    feeds = case.feeds("float32")
    xs = [x for x in case.xs if x in feeds and x not in case.straight_through]

    def outcome(status, reason="", ys=(), evaluations=0):
        return GradientOutcome(case.name, case.op, False, status, reason, tuple(case.xs), tuple(ys),
                               seconds=time.perf_counter() - start, evaluations=evaluations)

    if not xs and not case.straight_through:
        return outcome(NOT_DIFFERENTIABLE, "no float input to differentiate")
    status, reason, evaluations = PASS, "", 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = expected(case, "float32")
            model = load(case_model(case, "float32", want))
            ys = _float_outputs(case, want)
            for k, y in enumerate(ys):
                if xs:
                    res = checker(model, y, xs, [n for n in feeds if n not in xs], feeds, seed=seed + k)
                    evaluations += res.evaluations
                    if worse(res.status, status) != status:
                        status, reason = res.status, f"d{y}: {res.reason}"
                if case.straight_through:
                    st, why = _straight_through(model, case, y, feeds, seed + k)
                    if worse(st, status) != status:
                        status, reason = st, why
        except OnnxGradError as exc:
            return outcome(ERROR, str(exc).splitlines()[0][:300])
        except Exception as exc:
            return outcome(ERROR, _one_line(exc))
    return outcome(status, reason, ys, evaluations)


@dataclass(frozen=True)
class ContribRun:
    outcomes: tuple[CaseOutcome, ...]
    gradients: tuple[GradientOutcome, ...] = ()
    seconds: float = 0.0

    def to_json(self) -> dict:
        import collections

        import onnxruntime

        return {
            "onnxruntime": onnxruntime.__version__,
            "cases": len({o.name.split("@")[0] for o in self.outcomes}),
            "forward": dict(collections.Counter(o.status for o in self.outcomes)),
            "gradient": dict(collections.Counter(g.status for g in self.gradients)),
            "seconds": round(self.seconds, 3),
            "outcomes": [o.to_json() for o in self.outcomes],
            "gradients": [g.to_json() for g in self.gradients],
        }


def contrib_sweep(cases: Iterable[ContribCase] | None = None, *, gradients: bool = True, half: bool = True,
                  seed: int = 0, progress: Callable[[str, int, int, object], None] | None = None) -> ContribRun:
    from .contrib_cases import all_cases

    cases = list(all_cases() if cases is None else cases)
    start = time.perf_counter()
    outcomes, grads = [], []
    for i, case in enumerate(cases):
        fwd = run_forward(case)
        outcomes.append(fwd)
        if half and case.half:
            outcomes.append(run_forward(case, "float16"))
        if gradients and fwd.status == PASS:
            grads.append(run_gradient(case, seed))
        if progress is not None:
            progress("contrib", i + 1, len(cases), fwd)
    return ContribRun(tuple(outcomes), tuple(grads), time.perf_counter() - start)


def failed(run: ContribRun) -> bool:
    bad_forward = any(o.status in (MISMATCH, ERROR) for o in run.outcomes)
    return bad_forward or any(g.status in (FAIL, ERROR) for g in run.gradients)

