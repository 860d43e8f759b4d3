"""NNSmith's random graphs lowered (tests/nnsmith_lowering.py): a seeded few per precision, each selection
lowered, run by onnxruntime (graph optimizations off, its kernels as written) and held to torch autograd
through NNSmith's own module. The seeds include the graphs that once failed: a float16 ReduceMax after a
Resize that gave NaN (12), Conv pads past a small input (float32 138), a reduction of unknown rank
(float64 272). The sweep over 300 graphs per precision is benchmarks/bench_lower_nnsmith.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("nnsmith")
pytest.importorskip("onnxruntime")

from tests import nnsmith_graphs as ng  # noqa: E402
from tests import nnsmith_lowering as nl  # noqa: E402

SEEDS = [("float16", 12), ("float16", 3), ("float32", 138), ("float32", 7), ("float64", 272), ("float64", 7)]


@pytest.mark.parametrize("dtype, seed", SEEDS)
def test_lowered_gradients_match_torch(dtype, seed):
    graph = ng.generate(seed, dtypes=(dtype,))
    assert graph is not None and graph.dtype == dtype
    outcomes = nl.lowered_outcomes(graph)
    assert outcomes, "no selection"
    assert all(o.status == nl.MATCHED for o in outcomes), [(o.y, o.status, o.detail) for o in outcomes]


def test_a_wrong_rule_is_caught():
    """Sigmoid's backward rule swapped for Tanh's: the float16 graph of seed 12 (Cos, Resize, Sigmoid -> v9_0)
    is wrong there."""
    from engine.lowering.registry import BACKWARD

    graph = ng.generate(12, dtypes=("float16",))
    assert "Sigmoid" in graph.onnx_op_types
    sigmoid = BACKWARD["Sigmoid"]
    BACKWARD["Sigmoid"] = BACKWARD["Tanh"]
    try:
        broken = nl.lowered_outcomes(graph)
    finally:
        BACKWARD["Sigmoid"] = sigmoid
    assert [o.y for o in broken if o.status == nl.WRONG] == ["v9_0"]
