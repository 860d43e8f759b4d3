"""One gradient path (issue 32): Model.gradient, the backward graph's statistics, the explorer's
step mode and GradManager check xs, y and dy through engine.gradient.prepared alone, and the
stepping API (PreparedGradient.forward / backward / seed / nodes) gives the call's own gradients."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import engine
from engine.errors import FeedError
from engine.examples import default_feeds, spec_conv_gemm
from engine.gradient import prepared as prepared_module
from engine.gradient.prepared import GradientObserver, StepObserver
from explorer.stepper import trace
from tests import paths

from ..feed_models import TANH_W, tanh_matmul_model

CHECKS = ("leaf", "float_y", "seed_for")


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """The names of the prepared call's checks, in the order they run, whoever calls them."""
    seen: list[str] = []

    def spying(name, real):
        def spy(*args, **kwargs):
            seen.append(name)
            return real(*args, **kwargs)

        return spy

    for name in CHECKS:
        monkeypatch.setattr(prepared_module, name, spying(name, getattr(prepared_module, name)))
    return seen


@pytest.fixture(scope="module")
def conv_gemm():
    return engine.load(spec_conv_gemm())


def test_model_gradient_checks_through_the_prepared_call(conv_gemm, checks):
    conv_gemm.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds())
    assert checks == ["leaf", "leaf", "float_y", "seed_for"]


def test_the_backward_graph_statistics_go_through_the_prepared_call(conv_gemm, checks):
    result, _ = engine.gradient_with_stats(conv_gemm, "Y", ["W", "Z"], ["X"], feeds=default_feeds())
    assert checks == ["leaf", "leaf", "float_y", "seed_for"]
    reference = conv_gemm.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds())
    for x in ("W", "Z"):
        np.testing.assert_allclose(result.grads[x], reference.grads[x], rtol=1e-6, atol=1e-7)


def test_step_mode_goes_through_the_prepared_call(conv_gemm, checks):
    spec = conv_gemm.selection("Y", ["W", "Z"], ["X"])
    t = trace(conv_gemm, spec, default_feeds())
    # forward mode's pass along v (the xs as leaves, y float), then the gradient's own reverse pass:
    # y is never on one tape
    assert checks == ["leaf", "leaf", "float_y", "leaf", "leaf", "seed_for"]
    reference = conv_gemm.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds())
    for x in ("W", "Z"):
        np.testing.assert_allclose(t.grads[x], reference.grads[x], rtol=1e-5, atol=1e-6)


def test_gradmanager_goes_through_the_prepared_call(checks):
    gm = engine.GradManager(paths.ROOT / "sample_models" / "mlp.onnx").attach(["W1", "H1"])
    with gm:  # W1 a parameter, H1 an intermediate
        gm.run()
        gm.backward("loss")
    assert checks == ["leaf", "float_y", "seed_for"]  # H1 becomes a leaf; y and its seed
    checks.clear()
    with gm:
        gm.run(outputs=["logits"])
        gm.backward(["logits"], [np.ones((4, 3))])
    assert checks == ["leaf", "float_y", "seed_for"]


def test_a_dy_of_the_wrong_shape_is_refused_in_the_same_words_everywhere(conv_gemm):
    feeds, dy = default_feeds(), np.ones((5,), np.float32)
    y_shape = conv_gemm.gradient("Y", ["W"], ["X", "Z"], feeds=feeds).y.shape
    want = f"dy has shape (5,) but y 'Y' has shape {y_shape}"
    with pytest.raises(FeedError, match=re.escape(want)):
        conv_gemm.gradient("Y", ["W"], ["X", "Z"], feeds=feeds, dy=dy)
    with pytest.raises(FeedError, match=re.escape(want)):
        engine.gradient_with_stats(conv_gemm, "Y", ["W"], ["X", "Z"], feeds=feeds, dy=dy)
    prepared = conv_gemm.prepare_gradient("Y", ["W"], ["X", "Z"])
    tensors, _ = conv_gemm.gradient_call("Y", ["W"], ["X", "Z"], feeds).inputs(feeds)
    with pytest.raises(FeedError, match=re.escape(want)):
        prepared(*tensors, dy=torch.from_numpy(dy))
    with pytest.raises(FeedError, match=re.escape(want)):
        prepared.backward(prepared.forward(*tensors), dy)


# --- the stepping API ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tanh_model():
    return engine.load(tanh_matmul_model(2))


X = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)


class Log(GradientObserver):
    def __init__(self):
        self.sources, self.nodes, self.seeds = [], [], []

    def source(self, name, value):
        self.sources.append((name, value.requires_grad))
        return value

    def outputs(self, step, args, names, outs):
        self.nodes.append((step.node_index, step.name, step.op_type, tuple(names)))
        return outs

    def seed(self, name, value):
        self.seeds.append((name, value))


def test_forward_and_backward_are_the_call_in_two_halves(tanh_model):
    call = tanh_model.gradient_call("loss", ["X"], feeds={"X": X})
    tensors, values = call.inputs({"X": X})
    prepared = call.prepared
    whole = prepared(*tensors)
    plain = prepared.backward(prepared.forward(*tensors))
    assert torch.equal(plain.y, whole.y) and torch.equal(plain.grads[0], whole.grads[0])
    log = Log()
    observed = prepared.backward(prepared.forward(*tensors, observer=log), observer=log)
    torch.testing.assert_close(observed.grads[0], whole.grads[0], rtol=1e-6, atol=1e-7)
    graph = tanh_model.graph
    assert log.sources == [("X", True)]  # xs arrive as autograd leaves
    assert log.nodes == [(i, graph.node_names[i], graph.nodes[i].op_type, tuple(graph.nodes[i].output))
                         for i in prepared.nodes]
    assert [op for _, _, op, _ in log.nodes] == ["MatMul", "Tanh", "ReduceSum"]
    (name, seed), = log.seeds
    assert name == "loss" and seed.shape == () and float(seed) == 1.0
    result = call.result(observed, values)
    assert result.seed == "ones" and result.values["X"] is not X and np.array_equal(result.values["X"], X)


def test_an_observer_may_replace_what_a_node_computes(tanh_model):
    class Doubled(StepObserver):
        def outputs(self, step, args, names, outs):
            return [2 * o for o in outs] if step.op_type == "MatMul" else outs

    prepared = tanh_model.prepare_gradient("loss", ["X"])
    out = prepared.backward(prepared.forward(torch.from_numpy(X), observer=Doubled()))
    h = 2 * X.astype(np.float64) @ TANH_W
    np.testing.assert_allclose(out.y.numpy(), np.tanh(h).sum(), rtol=1e-6)
    np.testing.assert_allclose(out.grads[0].numpy(), 2 * (1 - np.tanh(h) ** 2) @ TANH_W.T, rtol=1e-5, atol=1e-6)


def test_seed_is_dy_checked_and_converted_else_ones(tanh_model):
    prepared = tanh_model.prepare_gradient("loss", ["X"], dtype="float64")
    x = torch.from_numpy(X.astype(np.float64))
    forward = prepared.forward(x)
    ones = prepared.seed(forward.y)
    assert ones.dtype == torch.float64 and ones.shape == () and float(ones) == 1.0
    two = prepared.seed(forward.y, np.float32(2.0))  # any array numpy takes, as y's dtype
    assert two.dtype == torch.float64 and float(two) == 2.0
    with pytest.raises(FeedError, match=re.escape("dy has shape (2,) but y 'loss' has shape ()")):
        prepared.seed(forward.y, [1.0, 2.0])
    log = Log()
    out = prepared.backward(forward, np.float32(3.0), observer=log)
    assert float(log.seeds[0][1]) == 3.0
    np.testing.assert_allclose(out.grads[0].numpy(), 3 * prepared(x).grads[0].numpy())


# --- the knots untied -------------------------------------------------------------------------
def test_nothing_in_engine_gradient_reaches_into_model_internals():
    for path in sorted((paths.ROOT / "engine" / "gradient").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"\bmodel\._[a-z]", text), path.name
        assert "from ..model import" not in text and "import Model" not in text, path.name


def test_the_stepper_uses_the_public_stepping_api_only():
    text = (paths.ROOT / "explorer" / "stepper.py").read_text()
    for internal in ("run_observed", ".steps", ".plan", "engine.run", "model.prepare("):
        assert internal not in text, internal
