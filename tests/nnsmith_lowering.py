"""NNSmith's random graphs (tests/nnsmith_graphs.py) lowered by engine.lower and run by onnxruntime, each
selection's gradients compared with torch autograd through NNSmith's own module, for
tests/lowering/test_nnsmith_lowering.py and benchmarks/bench_lower_nnsmith.py.

The lowered model runs in the graph's own precision, so it is held to torch's gradient in float64 within
what rounding in that precision costs: a floor per type, or ten times torch's own error when it runs the
module in that precision (an ill-conditioned graph loses as much in torch as in onnxruntime); a gradient
that cancels to zero is held to an absolute floor instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import torch

import engine
from engine.errors import OnnxGradError
from tests import nnsmith_graphs as ng

MATCHED, REFUSED, NAN, NO_KERNEL, WRONG, KINKED, NO_VERDICT, OVERFLOW, NO_MEMORY = (
    "matched", "refused", "nan", "ort-has-no-kernel", "wrong", "at a kink", "torch not finite",
    "engine not finite either", "ort out of memory")
FORWARD_DIFFERS = "ort's forward differs"
FLOOR = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-7}
# ...and an absolute one, in units of dy: a gradient that cancels to 0 (x / x) is roundoff alone, relative to nothing
FLOOR_ABS = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-13}
OWN_ERROR_FACTOR = 10.0
TORCH = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Outcome:
    seed: int
    y: str
    status: str
    detail: str = ""


def lowered_outcomes(graph: ng.RandomGraph, optimize: bool = False) -> list[Outcome]:
    """One outcome per selection of the graph (ng.selections)."""
    proto, out = graph.proto, []
    native = TORCH.get(graph.dtype, torch.float64)
    at_kinks = {**ng.kinks(graph), **_kinks(graph, native)}
    for y, xs, zs in ng.selections(graph):
        out.append(Outcome(graph.seed, y, *_verdict(graph, proto, y, xs, zs, native, at_kinks, optimize)))
    return out


def _kinks(graph, dtype) -> dict:
    try:
        return ng.kinks(graph, dtype)
    except RuntimeError:  # torch has no CPU kernel of some op in this precision
        return {}


def _verdict(graph, proto, y, xs, zs, native, at_kinks, optimize) -> tuple[str, str]:
    try:
        lowered = engine.lower(proto, y, xs, zs, dy=True)
    except OnnxGradError as exc:
        return REFUSED, str(exc)
    y_type = next(o.type.tensor_type.elem_type for o in proto.graph.output if o.name == y)  # not always the IR's
    dy = ng.random_dy(graph, y).astype(onnx.helper.tensor_dtype_to_np_dtype(y_type))
    feeds = {**graph.feeds, f"d{y}": dy}
    try:
        got = _ort_run(lowered, feeds, optimize)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors, sorted below
        text = str(exc)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            return NO_KERNEL, text[text.find("for ") + 4:][:120]
        if "Failed to allocate memory" in text:  # e.g. ConvTranspose's columns for a 169 x 399 kernel
            return NO_MEMORY, text[:120]
        raise
    grads = [got[f"d{y}_d{x}"] for x in xs]
    want = ng.torch_gradient(graph, y, xs, dy)
    if not all(np.isfinite(want[x]).all() for x in xs):
        return NO_VERDICT, ""
    if not all(np.isfinite(g).all() for g in grads):  # NaN where the engine's gradient in this precision is finite?
        engine_grads = engine.load(proto).gradient(y, xs, zs, graph.feeds, dy=dy).grads
        bad = [x for x, g in zip(xs, grads) if not np.isfinite(g[np.isfinite(np.asarray(engine_grads[x]))]).all()]
        if not bad:
            return OVERFLOW, ""
        forward = ng.relative_l2(np.asarray(got[y], np.float64), np.asarray(graph.expected[y], np.float64))
        return (NAN, ",".join(bad)) if forward <= FLOOR.get(graph.dtype, FLOOR["float64"]) else \
            (FORWARD_DIFFERS, f"not finite at {','.join(bad)}; y: relative L2 {forward:.2e} from NNSmith's own output")
    own = _torch_own_error(graph, y, xs, dy, native, want)
    worst = ""
    for x, g in zip(xs, grads):
        error = ng.relative_l2(np.asarray(g, np.float64), want[x])
        allowed = FLOOR.get(graph.dtype, FLOOR["float64"]) + OWN_ERROR_FACTOR * own.get(x, 0.0)
        noise = np.abs(np.asarray(g, np.float64) - want[x]).max(initial=0.0) <= FLOOR_ABS[graph.dtype] * np.abs(dy).max()
        if not error <= allowed and not noise:
            worst = f"{x}: relative L2 {error:.2e} > {allowed:.2e}"
            break
    if not worst:
        return MATCHED, ""
    forward = ng.relative_l2(np.asarray(got[y], np.float64), np.asarray(graph.expected[y], np.float64))
    if not forward <= FLOOR.get(graph.dtype, FLOOR["float64"]):  # e.g. float16 Tan at a pole: another y, another slope
        return FORWARD_DIFFERS, f"{worst}; y: relative L2 {forward:.2e} from NNSmith's own output"
    return (KINKED, ",".join(at_kinks[y])) if y in at_kinks else (WRONG, worst)


def _torch_own_error(graph, y, xs, dy, native, want) -> dict[str, float]:
    """torch's own relative error per x when it runs the module in the graph's precision, or in float32 where
    that is larger or the half run overflows (a gradient that cancels to ~0 is all roundoff in any precision)."""
    if native == torch.float64:
        return {}
    runs = [torch.float32] if native == torch.float32 else [native, torch.float32]
    errors = {x: 0.0 for x in xs}
    for dtype in runs:
        try:
            mine = ng.torch_gradient(graph, y, xs, dy, dtype=dtype)
        except RuntimeError:  # no CPU kernel in this precision
            continue
        for x in xs:
            e = ng.relative_l2(mine[x].astype(np.float64), want[x])
            errors[x] = max(errors[x], e) if np.isfinite(e) else errors[x]
    return errors


def _ort_run(model, feeds: dict, optimize: bool) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))
