"""NNSmith's random graphs (tests/nnsmith_graphs.py) lowered by engine.lower and run by onnxruntime, each
selection's gradients compared with torch autograd through NNSmith's own module, for
tests/lowering/test_nnsmith_lowering.py and benchmarks/bench_lower_nnsmith.py.

The lowered model runs in the graph's own precision, so it is held to torch's gradient in float64 within
what rounding in that precision costs: a floor per type, or ten times torch's own error when it runs the
module in that precision (an ill-conditioned graph loses as much in torch as in onnxruntime).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import engine
from engine.errors import OnnxGradError
from tests import nnsmith_graphs as ng

MATCHED, REFUSED, NAN, NO_KERNEL, WRONG, KINKED, NO_VERDICT, OVERFLOW, NO_MEMORY = (
    "matched", "refused", "nan", "ort-has-no-kernel", "wrong", "at a kink", "torch not finite",
    "engine not finite either", "ort out of memory")
FLOOR = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-7}
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
    want_dtype = graph.expected[y].dtype
    dy = ng.random_dy(graph, y).astype(want_dtype)
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
        return (NAN, ",".join(bad)) if bad else (OVERFLOW, "")
    own = _torch_own_error(graph, y, xs, dy, native, want)
    worst = ""
    for x, g in zip(xs, grads):
        error = ng.relative_l2(np.asarray(g, np.float64), want[x])
        allowed = FLOOR.get(graph.dtype, FLOOR["float64"]) + OWN_ERROR_FACTOR * own.get(x, 0.0)
        if not error <= allowed:
            worst = f"{x}: relative L2 {error:.2e} > {allowed:.2e}"
            break
    if not worst:
        return MATCHED, ""
    return (KINKED, ",".join(at_kinks[y])) if y in at_kinks else (WRONG, worst)


def _torch_own_error(graph, y, xs, dy, native, want) -> dict[str, float]:
    if native == torch.float64:
        return {}
    try:
        mine = ng.torch_gradient(graph, y, xs, dy, dtype=native)
    except RuntimeError:  # no CPU kernel in this precision: the float32 run as the estimate
        mine = ng.torch_gradient(graph, y, xs, dy, dtype=torch.float32)
    return {x: ng.relative_l2(np.nan_to_num(mine[x].astype(np.float64), nan=np.inf), want[x]) for x in xs}


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
