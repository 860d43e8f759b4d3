"""The float64 gradient's own rounding error: a gradient that is exactly zero comes out as roundoff,
which must not read as a wrong gradient, and the allowance made for it must not hide a real bug."""
import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import engine
from engine.verify import register_op_with_vjp
from engine.verify.context import build
from tests.verify.test_injected import N, _model
from tests.verify_models import F64, init, make, vi

check_module = importlib.import_module("engine.verify.check")


def _equal_logits(weight: float = 1e6):
    """Every column of w is the same, so every logit is the same number and softmax is exactly
    1/16 whatever x is: dy/dx = 0, and finite differences see y not move at all. The analytic
    VJP cancels terms of size `weight` and keeps their roundoff (1e-10 at 1e6)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    proto = make(nodes, [vi("x", [2, 8], F64)], [vi("y", [2, 16], F64)], [init("w", np.full((8, 16), weight))])
    return engine.load(proto), {"x": np.random.default_rng(0).standard_normal((2, 8))}


@pytest.mark.parametrize("mode", ["fast", "full", "sample"])
def test_a_zero_gradient_made_of_roundoff_passes(mode, monkeypatch):
    model, feeds = _equal_logits()
    report = engine.check(model, "y", ["x"], feeds=feeds, mode=mode, samples=4)
    (r,) = report.results
    assert report.verdict == "pass", report.summary()
    assert r.numeric == 0.0 and r.analytic != 0.0  # exact zero on one side, roundoff on the other
    # What the allowance is for: without it the model-level comparison does not pass this gradient
    # (the analytic roundoff against an exact zero fails, or, where a failure does not persist at a
    # smaller step, is inconclusive and left to the nodes).
    monkeypatch.setattr(check_module, "_with_analytic_roundoff", lambda ctx, probes, results, native: results)
    again = engine.check(model, "y", ["x"], feeds=feeds, mode=mode, samples=4)
    assert again.results[0].status != "pass" or again.results[0].resolved_by == "nodes", again.summary()


def test_the_roundoff_sample_is_tiny_beside_a_real_gradient():
    model = engine.load(_model("Tanh", ["h"], 6))
    ctx = build(model, "y", ["x"], (), {"x": np.random.default_rng(0).standard_normal((N, N))}, None, 0, "cpu", False)
    roundoff = ctx.analytic_roundoff()
    assert roundoff is not None
    assert float(roundoff["x"].max()) <= 1e-13 * float(ctx.grads64["x"].abs().max())


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_gradient_off_by_one_part_in_ten_thousand_still_fails(mode):
    """A real error is linear in dy like the right gradient: seeding with 3 * dy reproduces it,
    so the allowance stays at rounding level and the error stays visible."""
    wrong = lambda g, i, o: (1.0001 * g[0] * (1 - o[0] ** 2),)  # noqa: E731
    with register_op_with_vjp("Tanh", torch.tanh, wrong, since=6):
        model = engine.load(_model("Tanh", ["h"], 6))
        report = engine.check(model, "y", ["x"], feeds={"x": np.random.default_rng(0).standard_normal((N, N))},
                              mode=mode, rtol=1e-5)
    assert report.verdict == "fail", report.summary()
    assert report.first_failing_node == "bug"


@pytest.mark.parametrize("wrong", [
    lambda g, i, o: (1 - o[0] ** 2 + 0 * g[0],),  # ignores dy
    lambda g, i, o: (g[0] * g[0].abs() * (1 - o[0] ** 2),),  # quadratic in dy
], ids=["ignores_dy", "quadratic_in_dy"])
def test_a_vjp_not_linear_in_dy_gets_no_allowance(wrong):
    with register_op_with_vjp("Tanh", torch.tanh, wrong, since=6):
        model = engine.load(_model("Tanh", ["h"], 6))
        feeds = {"x": np.random.default_rng(0).standard_normal((N, N))}
        assert build(model, "y", ["x"], (), feeds, None, 0, "cpu", False).analytic_roundoff() is None
        report = engine.check(model, "y", ["x"], feeds=feeds, mode="fast")
    assert report.verdict == "fail", report.summary()


@settings(max_examples=8, deadline=None)
@given(factor=st.sampled_from([0.999, 1.001, 1.01, 0.9]), seed=st.integers(0, 2**16))
def test_scaled_vjps_fail_at_any_point(factor, seed):
    wrong = lambda g, i, o: (factor * g[0] * (1 - o[0] ** 2),)  # noqa: E731
    with register_op_with_vjp("Tanh", torch.tanh, wrong, since=6):
        model = engine.load(_model("Tanh", ["h"], 6))
        report = engine.check(model, "y", ["x"], feeds={"x": np.random.default_rng(seed).standard_normal((N, N))},
                              mode="full", seed=seed)
    assert report.verdict == "fail", report.summary()
