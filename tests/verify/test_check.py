"""engine.check end to end: modes, report, claimed gradients, second order, findings, control."""
import importlib
import json
import os
import threading
from xml.etree import ElementTree as ET

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import engine
from engine import examples
from engine.testing import GradientMismatch, assert_gradients_match
from engine.verify import register_op_with_vjp
from tests.verify_models import SAMPLES, deep_chain, init, make, to_float64, vi

X_FEED = {"X": examples.default_feeds()["X"]}


@pytest.fixture(scope="module")
def spec():
    return engine.load(examples.spec_conv_gemm())


def test_spec_model_passes_in_every_mode_with_the_documented_report(spec):
    for mode, per_x in (("full", {"W": 18, "Z": 24}), ("sample", {"W": 5, "Z": 5}), ("fast", {"W": 4, "Z": 4})):
        report = engine.check(spec, "Y", ["W", "Z"], ["X"], feeds=X_FEED, mode=mode, samples=5, directions=3)
        assert report.ok and report.verdict == "pass", report.summary()
        assert {r.name: r.checked for r in report.results} == per_x
        for r in report.results:
            assert r.status == "pass" and r.max_rel_err < 1e-6 and r.fd_error is not None or mode == "fast"
            assert r.native_dtype == "float32" and r.native_max_abs_err < 1e-5
    data = json.loads(report.to_json())
    assert {"ok", "verdict", "mode", "seed", "results", "schema_version"} <= set(data)
    assert {"name", "max_abs_err", "max_rel_err", "worst_index", "analytic", "numeric", "status"} <= set(data["results"][0])
    assert data["mode"] == "fast" and data["directions"] == 3 and data["dy"] == "random:0"
    suite = ET.fromstring(report.to_junit())
    assert suite.get("tests") == "2" and suite.get("failures") == "0"


def test_full_mode_elements_agree_with_torch_written_directly(spec):
    """The analytic side is the engine's; the reference here is torch.autograd on the same math."""
    report = engine.check(spec, "Y", ["W", "Z"], ["X"], feeds=X_FEED, dy=np.ones((1, 3)))
    x = torch.tensor(X_FEED["X"], dtype=torch.float64)
    consts = spec.constants(dtype="float64")
    w, z = consts["W"].clone().requires_grad_(), consts["Z"].clone().requires_grad_()
    y = torch.nn.functional.conv2d(x, w).flatten(1) @ z
    gw, gz = torch.autograd.grad(y.sum(), [w, z])
    for r, g in zip(report.results, (gw, gz)):
        assert r.analytic == pytest.approx(float(g[r.worst_index]), rel=1e-12)
        assert r.numeric == pytest.approx(float(g[r.worst_index]), rel=1e-6)


def test_row_compression_cuts_the_forwards_and_changes_no_verdict():
    model = engine.load(deep_chain(depth=3, width=8, batch=4))
    report = engine.check(model, "y", ["x"])
    (r,) = report.results
    assert r.status == "pass" and r.rows == 4 and r.checked == 32
    assert r.forwards <= 2 * 8 + 2 * 8  # first pass on 8 packed vectors, plus at most the same refined


def test_second_order_catches_a_vjp_that_is_right_to_first_order_only():
    def vjp(grads, inputs, outputs):
        return (grads[0] * (1 - outputs[0].detach() ** 2),)  # detach: its own derivative is lost

    proto = deep_chain(depth=2, width=4, batch=3)
    assert engine.check(engine.load(proto), "y", ["x"], order=2).verdict == "pass"
    with register_op_with_vjp("Tanh", torch.tanh, vjp, since=6):
        report = engine.check(engine.load(proto), "y", ["x"], order=2)
    assert [r.status for r in report.results] == ["pass"]
    assert [r.status for r in report.second_order] == ["fail"] and report.verdict == "fail"


def test_claimed_gradients_from_a_handwritten_backward_graph():
    good = engine.check(f"{SAMPLES}/handwritten_backward.onnx", "y", ["W", "X"], claimed=["W=dW", "X=dX"])
    assert good.verdict == "pass" and [c.status for c in good.claimed] == ["pass", "pass"]
    assert good.dy == "scalar"
    bad = engine.check(f"{SAMPLES}/handwritten_backward_bug.onnx", "y", ["W", "X"], claimed={"X": "dX"})
    (c,) = bad.claimed
    assert bad.verdict == "fail" and c.status == "fail" and c.max_abs_err_vs_fd > 0.1
    assert all(r.status == "pass" for r in bad.results)  # the engine's own gradient is right


def test_gradient_node_outputs_as_claims_use_ones_as_the_seed(spec):
    report = engine.check(spec, "Y", ["W", "Z"], ["X"], feeds=X_FEED, claimed=["W=dY_dW", "Z=dY_dZ"])
    assert report.dy == "ones" and report.verdict == "pass"
    assert all(c.max_abs_err_vs_engine < 1e-12 for c in report.claimed)


def test_kinks_are_inconclusive_never_failed_whatever_the_seed():
    for seed in range(3):
        for mode in ("full", "fast"):
            report = engine.check(f"{SAMPLES}/kinks.onnx", "loss", ["X", "Y"], mode=mode, seed=seed, per_node=True)
            assert report.verdict == "inconclusive", report.summary()
            assert not any(r.status == "fail" for r in report.results)
            assert not any(n.status == "fail" for n in report.nodes)
    assert "one-sided derivatives" in report.results[0].reason or report.results[0].problems


def test_nan_in_the_forward_and_in_the_backward_are_located():
    proto = make([helper.make_node("Log", ["x"], ["l"], name="log"), helper.make_node("Tanh", ["l"], ["y"], name="t")],
                 [vi("x", [3])], [vi("y", [3])])
    report = engine.check(proto, "y", ["x"], feeds={"x": np.array([1.0, -1.0, 2.0], np.float32)})
    (f,) = [f for f in report.findings if f.kind == "nonfinite-value"]
    assert f.node == "log" and f.tensor == "l"
    assert report.verdict != "pass"
    # y = x * sqrt(|x|) has derivative 0 at 0, but the chain rule meets sqrt'(0) = inf times 0.
    proto = make([helper.make_node("Abs", ["x"], ["a"], name="abs"), helper.make_node("Sqrt", ["a"], ["s"], name="sqrt"),
                  helper.make_node("Mul", ["x", "s"], ["y"], name="mul")], [vi("x", [3])], [vi("y", [3])])
    report = engine.check(proto, "y", ["x"], feeds={"x": np.array([0.0, 1.0, 4.0], np.float32)})
    (f,) = [f for f in report.findings if f.kind == "nonfinite-gradient"]
    assert f.node == "sqrt"
    assert report.results[0].status == "fail" and "analytic gradient is nan" in report.results[0].reason


def test_a_nondeterministic_model_is_inconclusive():
    with register_op_with_vjp("Tanh", lambda x: x * torch.rand_like(x), lambda g, i, o: (g[0],), since=6):
        report = engine.check(deep_chain(depth=1, width=4, batch=2), "y", ["x"])
    assert report.verdict == "inconclusive"
    assert [f.kind for f in report.findings] == ["nondeterministic"]


def test_disconnected_x_passes_with_a_reason():
    proto = make([helper.make_node("Tanh", ["a"], ["y"])], [vi("a", [2]), vi("b", [2])], [vi("y", [2])])
    report = engine.check(proto, "y", ["a", "b"])
    assert [r.status for r in report.results] == ["pass", "pass"]
    assert "does not depend" in report.results[1].reason


def test_float64_models_report_no_native_error():
    report = engine.check(to_float64(deep_chain(depth=2, width=4, batch=2)), "y", ["x"])
    assert report.verdict == "pass" and report.results[0].native_dtype is None


def test_progress_is_throttled_and_reaches_the_total():
    calls = []
    report = engine.check(deep_chain(depth=4, width=16, batch=8), "y", ["x"], mode="sample", samples=100,
                          progress=lambda d, t, s: calls.append((d, t, s)))
    assert report.ok and calls
    assert calls[-1][0] == calls[-1][1]
    assert all(0 <= d <= t for d, t, _ in calls) and len(calls) < 50


def test_should_stop_cancels_and_a_time_budget_truncates():
    model = engine.load(deep_chain(depth=4, width=32, batch=1))
    report = engine.check(model, "y", ["x"], should_stop=lambda: True)
    assert report.verdict == "cancelled" and not report.ok and report.stopped == "cancelled"
    report = engine.check(model, "y", ["x"], time_budget=0.0)
    assert report.stopped == "time budget" and report.truncated
    assert report.results[0].checked < 32 and report.verdict == "inconclusive"
    assert any(f.kind == "time-budget" for f in report.findings)


def test_a_check_cut_off_after_some_items_is_inconclusive_never_pass(monkeypatch):
    """A time budget that runs out part way leaves a random sample checked: a pass of the sample is
    no pass of the gradient (a UNet's 58 of 1,024 elements said PASS), so the verdict is inconclusive,
    exit 3 from the CLI, with how much was checked."""
    from engine.verify import fd

    model = engine.load(deep_chain(depth=4, width=32, batch=1))
    real = fd.Control.halted

    def halted(self, budget_applies=True):
        if budget_applies and self.deadline is not None and self.done >= 8:  # two batched calls, then no time
            self.stopped = self.stopped or "time budget"
            return True
        return real(self, budget_applies)

    monkeypatch.setattr(fd.Control, "halted", halted)
    monkeypatch.setattr(importlib.import_module("engine.verify.check"), "MAX_CHUNK", 4)  # 2 elements a call
    report = engine.check(model, "y", ["x"], mode="full", time_budget=60.0)
    (r,) = report.results
    assert 0 < r.checked < r.total and r.failed == 0, report.summary()
    assert r.status == "inconclusive" and report.verdict == "inconclusive" and report.truncated, report.summary()
    assert f"checked {r.checked} of {r.total}" in r.reason and "time-budget" in r.advice


def test_check_runs_in_a_worker_thread():
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", engine.check(deep_chain(2, 4, 2), "y", ["x"])))
    t.start()
    t.join(60)
    assert out["r"].ok


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="exhaustive"), "unknown mode"), (dict(order=3), "order"), (dict(rtol=-1.0), "rtol"),
    (dict(samples=0), "samples"), (dict(claimed=["W"]), "X=OUT"), (dict(claimed=["Q=dY_dW"]), "not in xs"),
    (dict(claimed=["W=nothing"]), "not a tensor"), (dict(dy=np.ones(7)), "dy has shape"),
])
def test_bad_arguments_are_one_line_errors(spec, kwargs, message):
    with pytest.raises(engine.OnnxGradError, match=message) as info:
        engine.check(spec, "Y", ["W", "Z"], ["X"], feeds=X_FEED, **kwargs)
    assert "\n" not in str(info.value)


def test_assert_gradients_match_raises_with_the_report():
    assert assert_gradients_match(f"{SAMPLES}/mlp.onnx", "loss", ["W1", "b1"], ["X", "T"], mode="fast").ok
    with pytest.raises(GradientMismatch) as info:
        assert_gradients_match(f"{SAMPLES}/handwritten_backward_bug.onnx", "y", ["X"], ["W"], claimed=["X=dX"])
    assert info.value.report.verdict == "fail" and "claimed dX" in str(info.value)
    assert_gradients_match(f"{SAMPLES}/kinks.onnx", "loss", ["X", "Y"], allow_inconclusive=True)


ACTIVATIONS = ["Tanh", "Sigmoid", "Softplus", "Elu", "Softsign"]


def _random_mlp(batch, width, act, seed, double, gain):
    rng = np.random.default_rng(seed)
    w1 = init("w1", (gain * rng.standard_normal((width, 7)) / np.sqrt(width)).astype(np.float32))
    w2 = init("w2", (gain * rng.standard_normal((7, 3)) / np.sqrt(7)).astype(np.float32))
    b = init("b", rng.standard_normal((7,)).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node(act, ["hb"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1)]
    proto = make(nodes, [vi("x", [batch, width])], [vi("y", [batch, 3])], [w1, w2, b])
    return (to_float64(proto) if double else proto), {"x": rng.standard_normal((batch, width))}


MLP = dict(batch=st.integers(1, 4), width=st.integers(1, 6), act=st.sampled_from(ACTIVATIONS),
           seed=st.integers(0, 2**16), double=st.booleans(), mode=st.sampled_from(["full", "fast"]))


@settings(max_examples=int(os.environ.get("VERIFY_EXAMPLES", "12")), deadline=None)
@given(**MLP)
def test_no_false_alarm_on_random_correct_mlps(batch, width, act, seed, double, mode):
    proto, feeds = _random_mlp(batch, width, act, seed, double, gain=1.0)
    report = engine.check(proto, "y", ["x", "w1", "b", "w2"], feeds=feeds, mode=mode, seed=seed)
    assert report.verdict == "pass", report.summary()


@settings(max_examples=int(os.environ.get("VERIFY_EXAMPLES", "12")), deadline=None)
@given(**MLP)
def test_saturated_models_may_be_inconclusive_but_never_fail(batch, width, act, seed, double, mode):
    """A softmax saturated to 1e-10 gradients is below what float64 differences resolve: no verdict."""
    proto, feeds = _random_mlp(batch, width, act, seed, double, gain=8.0)
    report = engine.check(proto, "y", ["x", "w1", "b", "w2"], feeds=feeds, mode=mode, seed=seed)
    assert report.verdict in ("pass", "inconclusive"), report.summary()
