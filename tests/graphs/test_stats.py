"""Gradient stats on backward edges agree with Model.gradient; autograd functions are named per node."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import engine
from engine.examples import default_feeds, spec_conv_gemm
from engine.graphs import TensorStats, gradient_with_stats, to_dot
from tests.graphs.test_diagrams import second_order


def _numpy_stats(arr: np.ndarray) -> tuple:
    finite = arr[np.isfinite(arr)]
    return (np.linalg.norm(finite), finite.min(), finite.max(), int(np.isnan(arr).sum()), int(np.isinf(arr).sum()))


def _check_dx_edges(stats, result):
    checked = 0
    for x, grad in result.grads.items():
        for e in stats.backward.edges_into(f"dx:{x}"):
            s = stats.edges[e.key]
            assert s.shape == grad.shape
            np.testing.assert_allclose((s.norm, s.min, s.max), _numpy_stats(grad)[:3], rtol=1e-6, atol=1e-12)
            assert (s.nan_count, s.inf_count) == _numpy_stats(grad)[3:]
            checked += 1
    return checked


def test_conv_gemm_stats_agree_with_model_gradient():
    model = engine.load(spec_conv_gemm())
    feeds = default_feeds()
    result, stats = gradient_with_stats(model, "Y", ["W", "Z"], ["X"], feeds=feeds)
    reference = model.gradient("Y", ["W", "Z"], ["X"], feeds=feeds)
    for x in ("W", "Z"):
        np.testing.assert_array_equal(result.grads[x], reference.grads[x])
    np.testing.assert_array_equal(result.y, reference.y)
    assert _check_dx_edges(stats, reference) == 2
    assert all(stats.edges[e.key] is not None for e in stats.backward.edges)
    seed = stats.edges["seed->b3"]
    assert seed.shape == (1, 3) and seed.min == seed.max == 1.0  # the default seed: ones like Y
    functions = {model.graph.nodes[i].op_type: fns for i, fns in stats.torch_functions.items()}
    assert any("Convolution" in f for f in functions["Conv"])
    assert functions["Gemm"] and functions["Flatten"]


def test_seed_dy_and_float64_reach_the_stats():
    model = engine.load(spec_conv_gemm())
    dy = np.array([[1.0, -2.0, 0.5]])
    result, stats = gradient_with_stats(model, "Y", ["W", "Z"], ["X"], feeds=default_feeds(), dy=dy,
                                        dtype="float64")
    reference = model.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds(), dy=dy, dtype="float64")
    assert result.seed == "dy" and result.grads["W"].dtype == np.float64
    np.testing.assert_array_equal(result.grads["W"], reference.grads["W"])
    assert stats.edges["seed->b3"].min == -2.0 and stats.edges["seed->b3"].dtype == "float64"
    assert _check_dx_edges(stats, reference) == 2


def test_second_order_stats_through_a_gradient_node():
    model = engine.load(second_order())
    rng = np.random.default_rng(2)
    feeds = {"X": rng.standard_normal((4, 3)), "W": rng.standard_normal((3, 2)), "L": rng.standard_normal((4, 2))}
    result, stats = gradient_with_stats(model, "dO_dW", ["X", "W"], ["L"], feeds=feeds, dtype="float64")
    reference = model.gradient("dO_dW", ["X", "W"], ["L"], feeds=feeds, dtype="float64")
    np.testing.assert_allclose(result.grads["W"], reference.grads["W"], rtol=1e-12)
    assert _check_dx_edges(stats, reference) == 2
    (grad_node,) = [i for i in stats.backward.active_nodes if model.graph.nodes[i].op_type == "Gradient"]
    assert stats.torch_functions[grad_node]  # double backward through the first Gradient node


def test_nan_and_inf_are_counted_and_flagged_in_dot():
    graph = helper.make_graph(
        [helper.make_node("Log", ["A"], ["L"]), helper.make_node("Sqrt", ["A"], ["S"]),
         helper.make_node("Add", ["L", "S"], ["Y"])],
        "bad", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    model = engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    feeds = {"A": np.array([0.0, -1.0, 1.0, 4.0], np.float32)}
    result, stats = gradient_with_stats(model, "Y", ["A"], feeds=feeds)
    reference = model.gradient("Y", ["A"], feeds=feeds)
    assert _check_dx_edges(stats, reference) == 1
    s = stats.edges["acc:A->dx:A"]
    assert s.nan_count + s.inf_count >= 1 and not s.finite
    dot = to_dot(model, stats.backward.spec, view="backward", stats=stats)
    assert "penwidth=2" in dot and "nan=" in dot


def test_tensor_stats_of_empty_and_all_nan():
    assert TensorStats.of(np.zeros((0, 3))).norm == 0.0
    s = TensorStats.of(np.array([np.nan, np.inf]))
    assert (s.nan_count, s.inf_count, s.norm) == (1, 1, 0.0)


def test_bad_dy_and_feeds_are_one_line_errors():
    model = engine.load(spec_conv_gemm())
    with pytest.raises(engine.FeedError, match="dy has shape"):
        gradient_with_stats(model, "Y", ["W"], ["X", "Z"], feeds=default_feeds(), dy=np.ones((2, 2)))
    with pytest.raises(engine.FeedError, match="names no tensor"):
        gradient_with_stats(model, "Y", ["W"], ["X", "Z"], feeds={"nope": 1.0})
    with pytest.raises(engine.SelectionError, match="not an independent"):
        gradient_with_stats(model, "Y", ["H", "W"], ["X"])


def test_layout_edges_find_their_stats():
    from engine.graphs import layout_graph

    model = engine.load(spec_conv_gemm())
    result, stats = gradient_with_stats(model, "Y", ["W", "Z"], ["X"], feeds=default_feeds())
    layout = layout_graph(model, stats.backward.spec, "backward", engine="layered")
    keyed = [e for e in layout.edges if e.stats_key is not None]
    assert len(keyed) == len(stats.backward.edges)
    into_dw = next(e for e in keyed if e.target.endswith("dx:W"))
    assert stats.edges[into_dw.stats_key].norm == pytest.approx(np.linalg.norm(result.grads["W"]), rel=1e-6)


@pytest.mark.cuda
def test_stats_on_cuda_match_cpu():
    model = engine.load(spec_conv_gemm())
    _, on_cpu = gradient_with_stats(model, "Y", ["W", "Z"], ["X"], feeds=default_feeds(), dtype="float64")
    result, on_gpu = gradient_with_stats(model, "Y", ["W", "Z"], ["X"], feeds=default_feeds(), device="cuda",
                                         dtype="float64")
    assert result.device.startswith("cuda")
    for key, s in on_cpu.edges.items():
        assert on_gpu.edges[key].norm == pytest.approx(s.norm, rel=1e-9)
