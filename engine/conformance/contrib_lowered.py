"""The contrib lowering sweep (`onnxgrad conformance --contrib --lower`): every generated com.microsoft case
whose op has an ai.onnx expansion (engine/lowering/contrib.py), in float32 and float16, lowered with
`engine.lower` for each of its float outputs, run by onnxruntime's CPU provider and compared with the
engine: the lowered model's forward outputs against the engine's run, its gradients w.r.t. the case's
xs (seeded with a random dy) against the engine's gradient.

Tolerances are counted in units of the type's epsilon at the value's scale: |lowered − engine| ≤
ULPS[dtype] · eps · scale per tensor, scale = max(1, max |engine|). The largest magnitude, not each
element's: sums of products cancel, so an element's own magnitude says little about its rounding; and
at least 1, since the cases feed unit-scale inputs and dy, so the terms that cancel into a small result
are O(1) (FastGelu's 0.5·x·(1 + tanh) of a very negative x is 1e-4 with errors of eps at x's scale).
In float16 both sides compute the attention family, the norms' statistics and the quantized matmuls
in float32 and round once; an expansion of an activation (Gelu, FastGelu, …) and the backward graph
round after each of their float16 ops where the engine's torch kernels round once per op: the longest
float16 chains are ~12 ops, half an ulp each (8). In float32 the roundings are 2^13 times smaller than
float16's, and what remains is the order of sums: reductions of up to 64 terms (matmuls, softmax,
the scales' blocks) whose results cancel below their terms' scale (16).

Quantized weights (MatMulNBits' B and zero points, GatherBlockQuantized's data, …) are initializers in
the lowered models, as in real exports: the expansions unpack them into constants.
"""
from __future__ import annotations

import collections
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..errors import LoweringError
from .contrib import case_model, expected
from .contrib_case import MS, ContribCase
from .status import ERROR, LOWERED, NO_ORACLE, NOT_APPLICABLE, REFUSED, WRONG

EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps)}
ULPS = {"float32": 16, "float16": 8}
# The integer weights each op's expansion reads as constants (unpacked, or folded into its MatMulInteger).
WEIGHTS = {"MatMulNBits": ("B", "zero_points", "g_idx"), "GatherBlockQuantized": ("data", "zero_points"),
           "DynamicQuantizeMatMul": ("B", "b_zero_point"), "MatMulIntegerToFloat": ("B", "b_zero_point")}
DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class ContribLowering:
    """One case in one type: lowered, run by onnxruntime and compared (status `lowered`), or why not."""

    name: str
    op: str
    dtype: str
    status: str
    reason: str = ""
    ulps: float = 0.0  # the worst |lowered − engine| over its outputs and gradients, in eps at their scale
    lowerings: int = 0  # how many ys it lowered
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "dtype": self.dtype, "status": self.status, "reason": self.reason,
                "ulps": round(self.ulps, 2), "lowerings": self.lowerings, "seconds": round(self.seconds, 4)}


def expanded_ops() -> frozenset[str]:
    from ..lowering.contrib import EXPANSIONS

    return frozenset(EXPANSIONS)


def lowerable(cases: Iterable[ContribCase]) -> list[ContribCase]:
    """The cases whose op has an expansion."""
    ops = expanded_ops()
    return [c for c in cases if c.op in ops]


def ulps(got, want, dtype: str) -> float:
    """max |got − want| in units of dtype's epsilon at want's scale (its largest finite magnitude, at least
    1); inf for a shape mismatch or a NaN or inf where the engine has none."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    same = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got - want))
    if np.isnan(diff).any():
        return float("inf")
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
    return float(diff.max(initial=0.0)) / (EPS[dtype] * scale)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _float_outputs(case: ContribCase, values) -> list[str]:
    return [n for n, v in zip(case.outputs, values) if np.asarray(v).dtype.kind == "f" and np.asarray(v).size]


def _ort(proto, feeds: dict) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def held_as_initializers(proto, values: dict):
    """proto (in place) with the graph inputs named in `values` turned into initializers holding them."""
    from onnx import numpy_helper

    kept = [i for i in proto.graph.input if i.name not in values]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n) for n, v in values.items())
    return proto


def lower_contrib_case(case: ContribCase, dtype: str = "float32", seed: int = 0) -> ContribLowering:
    """Lower the gradient of each float output of `case` w.r.t. its xs, run it, compare with the engine."""
    from .. import load
    from ..lowering import lower

    start = time.perf_counter()
    name = case.name if dtype == "float32" else f"{case.name}@{dtype}"

    def outcome(status, reason="", worst=0.0, count=0):
        return ContribLowering(name, case.op, dtype, status, reason, worst, count, time.perf_counter() - start)

    feeds = case.feeds(dtype)
    try:
        typed = expected(case, dtype)
    except Exception as exc:  # noqa: BLE001 - onnxruntime refuses the form: the forward sweep says so
        return outcome(NO_ORACLE, "onnxruntime: " + _one_line(exc))
    held = {n: v for n, v in feeds.items() if n in WEIGHTS.get(case.op, ()) and v.dtype.kind in "iu"}
    proto = held_as_initializers(case_model(case, dtype, typed), held)
    feeds = {n: v for n, v in feeds.items() if n not in held}
    xs = [x for x in case.xs if x in feeds]
    zs = [n for n in feeds if n not in xs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = load(proto)
            engine_out = model.run(feeds)
        except Exception as exc:  # noqa: BLE001 - the forward sweep reports the engine's failures
            return outcome(NOT_APPLICABLE, "the engine cannot run it: " + _one_line(exc))
        ys = _float_outputs(case, typed)
        if not xs or not ys:
            return outcome(NOT_APPLICABLE, "no float input or output to differentiate")
        rng = np.random.default_rng(seed)
        worst = 0.0
        for k, y in enumerate(ys):
            dy = rng.standard_normal(np.shape(engine_out[y])).astype(np.asarray(engine_out[y]).dtype)
            names = [f"lowered_d{y}_d{x}" for x in xs]
            try:
                lowered = lower(proto, y, xs, zs, dy="lowered_dy", names=names)
            except LoweringError as exc:
                return outcome(REFUSED, str(exc).splitlines()[0][:300], worst, k)
            except Exception as exc:  # noqa: BLE001 - an expansion that crashes is a bug to list
                return outcome(ERROR, "lowering raised " + _one_line(exc), worst, k)
            left = sorted({n.op_type for n in lowered.graph.node if n.domain == MS})
            if left:
                return outcome(ERROR, f"com.microsoft ops left in the lowered model: {', '.join(left)}", worst, k)
            try:
                got = _ort(lowered, {**feeds, "lowered_dy": dy})
                want = model.gradient(y, xs, zs, feeds, dy=dy).grads
            except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal of the lowered file is the finding
                return outcome(ERROR, _one_line(exc), worst, k)
            pairs = [(f"d{y}/d{x}", got.get(n), want[x]) for x, n in zip(xs, names)]
            if k == 0:
                pairs = [(out, got.get(out), engine_out[out]) for out in ys] + pairs
            for label, g, w in pairs:
                err = ulps(g, w, dtype) if g is not None else float("inf")
                worst = max(worst, err)
                if not err <= ULPS[dtype]:
                    return outcome(WRONG, f"{label}: {err:.3g} ulps > {ULPS[dtype]}", worst, k + 1)
    return outcome(LOWERED, "", worst, len(ys))


@dataclass(frozen=True)
class ContribLoweringRun:
    outcomes: tuple[ContribLowering, ...]
    seconds: float = 0.0

    def per_op(self) -> dict[str, dict[str, tuple[int, int]]]:
        """op -> dtype -> (lowered, cases)."""
        out: dict[str, dict[str, list[int]]] = collections.defaultdict(lambda: {d: [0, 0] for d in DTYPES})
        for o in self.outcomes:
            cell = out[o.op][o.dtype]
            cell[0] += o.status == LOWERED
            cell[1] += 1
        return {op: {d: tuple(c) for d, c in cells.items()} for op, cells in sorted(out.items())}

    def failed(self) -> list[ContribLowering]:
        return [o for o in self.outcomes if o.status in (WRONG, ERROR, REFUSED)]

    def to_json(self) -> dict:
        return {"cases": len({o.name.split("@")[0] for o in self.outcomes}),
                "lowered": dict(collections.Counter(o.status for o in self.outcomes)),
                "ulps": ULPS, "seconds": round(self.seconds, 3),
                "outcomes": [o.to_json() for o in self.outcomes]}


def contrib_lowering_sweep(cases: Iterable[ContribCase] | None = None, *, seed: int = 0, half: bool = True,
                           progress: Callable[[str, int, int, object], None] | None = None) -> ContribLoweringRun:
    """Every case of an op with an expansion (of `cases`, default all), in float32 and (where the case has
    one) float16."""
    from .contrib_cases import all_cases

    chosen = lowerable(all_cases() if cases is None else cases)
    start = time.perf_counter()
    outcomes = []
    for i, case in enumerate(chosen):
        outcomes.append(lower_contrib_case(case, "float32", seed))
        if half and case.half:
            outcomes.append(lower_contrib_case(case, "float16", seed))
        if progress is not None:
            progress("contrib lowering", i + 1, len(chosen), outcomes[-1])
    return ContribLoweringRun(tuple(outcomes), time.perf_counter() - start)
