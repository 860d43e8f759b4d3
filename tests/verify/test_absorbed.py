"""Perturbations the network rounds away (engine/verify/absorbed.py): b added to values of 1e10
moves them by less than an ulp at the default step, so finite differences read 0 (or a multiple
of ulp / h). A right gradient must not fail there, and a wrong one (scaled, or zero) must not pass."""
import importlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import helper

import engine
from engine.verify import register_op_with_vjp
from tests.verify_models import F64, init, make, vi

absorbed = importlib.import_module("engine.verify.absorbed")
N = 6
VJPS = {"right": lambda g, i, o: (g[0], g[0]),
        "scaled_1.01": lambda g, i, o: (g[0], 1.01 * g[0]),
        "zero": lambda g, i, o: (g[0], 0 * g[0])}


def _huge(scale: float, kind: str):
    """z = scale * x + b with x = 1, then y = z - scale * x (b, rounded to the ulp of scale) or
    y = Softmax(z) (logits all near scale, as squeezenet's constant weights give)."""
    last = (helper.make_node("Sub", ["z", "t"], ["y"]) if kind == "cancel"
            else helper.make_node("Softmax", ["z"], ["y"]))
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Add", ["t", "b"], ["z"], name="bias"), last]
    proto = make(nodes, [vi("x", [N], F64), vi("b", [N], F64)], [vi("y", [N], F64)], [init("s", np.array(scale))])
    return engine.load(proto)


def _check(scale, kind, vjp, mode, seed=0):
    with register_op_with_vjp("Add", lambda a, b: a + b, VJPS[vjp], since=7):
        model = _huge(scale, kind)
        b = 0.5 * np.random.default_rng(seed).standard_normal(N)
        return engine.check(model, "y", ["b"], ["x"], feeds={"x": np.ones(N), "b": b}, mode=mode, seed=seed)


@pytest.mark.parametrize("mode", ["full", "sample", "fast"])
@pytest.mark.parametrize("kind", ["cancel", "softmax"])
def test_a_right_gradient_passes_where_the_step_is_rounded_away(kind, mode, monkeypatch):
    report = _check(1e10, kind, "right", mode)
    assert report.verdict == "pass", report.summary()
    (r,) = report.results
    assert abs(r.numeric - r.analytic) <= 1e-4 * abs(r.analytic), report.summary()
    # What this guards against: measured at the default step alone, the same check fails (or,
    # where the quotient reads as a kink, is inconclusive).
    monkeypatch.setattr(absorbed, "settle", lambda probe, a, tol, v: None)
    assert _check(1e10, kind, "right", mode).verdict in ("fail", "inconclusive")


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("vjp", ["scaled_1.01", "zero"])
@pytest.mark.parametrize("kind", ["cancel", "softmax"])
def test_a_wrong_gradient_still_fails_there(kind, vjp, mode):
    report = _check(1e10, kind, vjp, mode)
    assert report.verdict == "fail", report.summary()
    assert report.first_failing_node == "bias", report.summary()


def test_what_no_step_resolves_is_inconclusive_with_the_reason():
    """Logits of 1e12 have an ulp of 1.2e-4: no step both clears that and stays under softmax's
    curvature, so the elements are inconclusive, saying why, never passed or failed."""
    report = _check(1e12, "softmax", "right", "full")
    assert report.verdict == "inconclusive", report.summary()
    assert "may round the perturbation away" in report.summary()
    assert report.results[0].failed == 0


def test_ordinary_magnitudes_never_reach_the_ladder(monkeypatch):
    """A failing check of an O(1) network measures nothing more: the bug catalogue costs the same."""
    calls = []
    real = absorbed.settle
    monkeypatch.setattr(absorbed, "settle", lambda *a: calls.append(real(*a)) or calls[-1])
    assert _check(1.0, "softmax", "scaled_1.01", "full").verdict == "fail"
    assert calls and all(c is None for c in calls)


@settings(max_examples=12, deadline=None)
@example(scale=1e9, kind="softmax", mode="fast", seed=320)  # a wrong 1.01x passed at the rounded first step
@given(scale=st.sampled_from([1.0, 1e3, 1e6, 1e8, 1e9, 1e10, 1e11]), kind=st.sampled_from(["cancel", "softmax"]),
       mode=st.sampled_from(["full", "fast"]), seed=st.integers(0, 2**16))
def test_over_scales_right_never_fails_and_wrong_never_passes(scale, kind, mode, seed):
    """Up to values of 1e10 a larger step resolves every element: the right gradient passes and a
    wrong one fails. One random direction (fast mode) may stay inconclusive, never wrongly decided;
    a direction along which softmax does not move (all signs equal) cannot tell gradients apart."""
    right = _check(scale, kind, "right", mode, seed)
    # Where the logits' ulp meets softmax's curvature (1e8 and up: some element's best step resolves
    # only a few 1e-3 of the gradient) a pass would not be resolved: inconclusive, never failed.
    resolvable = mode == "full" and (scale <= 1e10 if kind == "cancel" else scale <= 1e6)
    assert right.verdict in (("pass",) if resolvable else ("pass", "inconclusive")), right.summary()
    blind = mode == "fast" and abs(right.results[0].analytic) < 1e-12
    for vjp in ("scaled_1.01", "zero"):
        wrong = _check(scale, kind, vjp, mode, seed)
        if mode == "full":
            assert wrong.verdict == "fail", wrong.summary()
        elif not blind:
            assert wrong.verdict in ("fail", "inconclusive"), wrong.summary()


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_gradient_through_a_dead_unit_still_fails_among_huge_values(mode):
    """y = (s + Relu(b)) - s with b < 0: the true gradient is exactly 0 and no step moves y, as when
    s rounds a step away. Steps beyond where s could round them away tell the two apart: a Relu
    whose VJP lets the gradient through everywhere must still fail."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Relu", ["b"], ["r"], name="dead"),
             helper.make_node("Add", ["t", "r"], ["z"]), helper.make_node("Sub", ["z", "t"], ["y"])]
    proto = make(nodes, [vi("x", [N], F64), vi("b", [N], F64)], [vi("y", [N], F64)], [init("s", np.array(1e10))])
    feeds = {"x": np.ones(N), "b": -1.0 - np.abs(np.random.default_rng(0).standard_normal(N))}
    report = engine.check(engine.load(proto), "y", ["b"], ["x"], feeds=feeds, mode=mode)
    assert report.verdict == "pass", report.summary()
    with register_op_with_vjp("Relu", lambda b: b.clamp(min=0), lambda g, i, o: (g[0],), since=14):
        report = engine.check(engine.load(proto), "y", ["b"], ["x"], feeds=feeds, mode=mode)
    assert report.verdict == "fail", report.summary()
    assert report.first_failing_node == "dead", report.summary()
