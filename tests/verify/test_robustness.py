"""Edge cases from the conformance sweep: empty tensors, shape steps, zero gradients, readable indices."""
import json

import numpy as np
import pytest
import torch
from onnx import helper

import engine
from tests.verify_models import F64, SAMPLES, make, vi

EMPTY_FEEDS = {"x": np.zeros((0, 3)), "w": np.ones(3)}


@pytest.fixture(scope="module")
def empty_mul():
    # y = x * w with x of shape (0, 3): x is empty, and so is y (w is not).
    return engine.load(make([helper.make_node("Mul", ["x", "w"], ["y"])], [vi("x", [0, 3], F64), vi("w", [3], F64)],
                            [vi("y", [0, 3], F64)]))


@pytest.mark.parametrize("kwargs", [dict(mode="full"), dict(mode="sample"), dict(mode="fast"), dict(order=2),
                                    dict(per_node=True), dict(claimed=["x=y"])])
def test_an_empty_x_or_y_passes_with_nothing_checked(empty_mul, kwargs):
    report = engine.check(empty_mul, "y", ["x", "w"], feeds=EMPTY_FEEDS, **kwargs)
    assert report.verdict == "pass", report.summary()
    x, w = report.results
    assert (x.status, x.checked, x.total) == ("pass", 0, 0) and "empty" in x.reason and "'x'" in x.reason
    assert (w.status, w.checked, w.total) == ("pass", 0, 3) and "empty" in w.reason and "'y'" in w.reason
    assert json.loads(report.to_json())["results"][0]["status"] == "pass"
    for c in report.claimed:
        assert c.status == "pass" and "empty" in c.reason


def _range_model():
    # y = Range(0, l, 1) * l: the length of the range is ceil(l), so at l = 3 a step up adds an element.
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Mul", ["r", "l"], ["y"])]
    return engine.load(make(nodes, [vi("s", [], F64), vi("l", [], F64), vi("d", [], F64)], [vi("y", ["n"], F64)]))


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_perturbation_that_changes_the_output_shape_is_inconclusive(mode):
    feeds = {"s": np.array(0.0), "l": np.array(3.0), "d": np.array(1.0)}
    report = engine.check(_range_model(), "y", ["l"], ["s", "d"], feeds=feeds, mode=mode)
    (r,) = report.results
    assert report.verdict == "inconclusive" and r.status == "inconclusive" and r.failed == 0
    assert "the output shape changes under perturbation (a step in the function)" in r.reason
    # Away from the step the same model is smooth in l and passes: d(sum_k dy_k k l)/dl = 0 + 1 + 2 with dy = 1
    # (fast mode: along a random direction u of l's one element, 3u).
    feeds["l"] = np.array(2.5)
    report = engine.check(_range_model(), "y", ["l"], ["s", "d"], feeds=feeds, mode=mode, dy=np.ones(3))
    (r,) = report.results
    assert report.verdict == "pass" and r.numeric == pytest.approx(r.analytic, rel=1e-6)
    if mode == "full":
        assert r.numeric == pytest.approx(3.0, rel=1e-6)


# Fast mode with 4 directions: one ±1 direction that moves both tied entries alike keeps the tie.
@pytest.mark.parametrize("kwargs", [dict(mode="full"), dict(mode="sample"), dict(mode="fast", directions=4),
                                    dict(order=2), dict(per_node=True)])
def test_value_dependent_shapes_inside_a_batch_are_inconclusive(kwargs):
    """onnx's Unique case: X has ties, so a perturbation splits them and Y gains a column. Batched,
    the entries' outputs stack to another shape (native batching) or none (vmap): each entry must
    be judged alone, as unbatched, not crash on the stacked shape."""
    from engine.conformance.cases import case_named

    case = case_named("test_unique_sorted_with_negative_axis")
    x = case.data_sets[0][0][0]
    assert len(np.unique(x, axis=-1)[0]) < x.shape[-1]  # the tie the test is about
    report = engine.check(engine.load(case.model), "Y", ["X"], feeds={"X": x}, **kwargs)
    assert report.verdict == "inconclusive", report.summary()
    for r in (*report.results, *report.second_order):
        assert r.status == "inconclusive" and r.failed == 0
        assert "the output shape changes under perturbation (a step in the function)" in r.reason
    # Without ties the shapes hold and the same check passes.
    distinct = np.arange(9, dtype=np.float32).reshape(3, 3) * 0.37
    assert engine.check(engine.load(case.model), "Y", ["X"], feeds={"X": distinct}, **kwargs).verdict == "pass"


def test_a_batch_stacked_to_another_shape_falls_back_to_single_calls():
    from engine.verify.batching import BatchEvaluator

    def head(x):  # as many leading entries as the last row has positive ones: a data-dependent shape
        return x[..., : int((x.reshape(-1, x.shape[-1])[-1] > 0).sum())]

    # Stacked, the last entry decides the shape for all: (3, 3), and that entry checks out alone.
    ev = BatchEvaluator(head, shape=(2,))
    xb = torch.tensor([[1.0, 2.0, -1.0], [3.0, 4.0, -1.0], [1.0, 2.0, 3.0]])
    out = ev(xb)
    assert ev.strategy == "loop" and ev.changed == [False, False, True]
    assert out.shape == (3, 2) and torch.equal(out[:2], xb[:2, :2]) and torch.isnan(out[2]).all()


def test_a_gradient_that_is_zero_up_to_roundoff_passes_by_its_nodes():
    """Analytic -5e-16 against numeric 0 is no failure, and no resolved pass either (the quantity
    compared is zero): the nodes, each well conditioned alone, settle it."""
    # y = Softmax(x + m) over a row: d<dy, y>/dm summed over... each m_j shifts one logit, and with
    # dy = ones the softmax's sum never moves: the exact gradient is 0, the engine's is roundoff.
    nodes = [helper.make_node("Add", ["x", "m"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    model = engine.load(make(nodes, [vi("x", [2, 8], F64), vi("m", [1, 8], F64)], [vi("y", [2, 8], F64)]))
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 8)), "m": np.zeros((1, 8))}
    report = engine.check(model, "y", ["m"], ["x"], feeds=feeds, dy=np.ones((2, 8)))
    (r,) = report.results
    assert r.status == "pass" and r.resolved_by == "nodes" and r.failed == 0 and r.max_abs_err < 1e-9, report.summary()
    assert report.nodes and all(n.status == "pass" for n in report.nodes)
    # The same tolerance still fails a wrong gradient there: a random dy makes it nonzero and a
    # scaled VJP is caught (the injected-bug suite covers this at large).
    assert engine.check(model, "y", ["m"], ["x"], feeds=feeds).verdict == "pass"


def test_attention_node_case_with_a_zero_mask_gradient_is_no_failure():
    pytest.importorskip("onnx.backend.test")
    from engine.conformance.cases import case_named
    from engine.conformance.gradients import selection_for

    try:
        case = case_named("test_attention_local_window_ext_cache_float16_mask")
    except KeyError:
        pytest.skip("this onnx has no such node case")
    sel = selection_for(case)
    assert not isinstance(sel, str)
    xs, zs, ys, feeds, _ = sel
    model = engine.load(case.model, check=False)
    report = engine.check(model, ys[0], ["attn_mask"], [n for n in xs + zs if n != "attn_mask"], feeds)
    (r,) = report.results
    # The gradient is zero (roundoff, 5e-16): no failure, and no resolved pass against a zero either;
    # the same node alone cannot do better. An absolute tolerance says what the caller accepts.
    assert r.status == "inconclusive" and r.failed == 0 and "does not resolve" in r.reason, r.reason
    assert "--atol" in r.advice, r.advice
    again = engine.check(model, ys[0], ["attn_mask"], [n for n in xs + zs if n != "attn_mask"], feeds, atol=1e-6)
    assert again.verdict == "pass" and again.results[0].max_abs_err < 1e-12, again.summary()


def test_claimed_gradient_failure_prints_plain_int_indices():
    report = engine.check(f"{SAMPLES}/handwritten_backward_bug.onnx", "y", ["X"], ["W"], claimed=["X=dX"])
    (c,) = report.claimed
    assert c.status == "fail" and "np." not in c.reason and "worst at [" in c.reason
    assert all(type(i) is int for i in c.worst_index) and "np." not in report.summary()


def test_a_second_check_of_the_same_model_reuses_the_row_probe_and_batching(monkeypatch):
    import engine.verify.xcheck as xcheck
    from tests.verify_models import deep_chain

    model = engine.load(deep_chain(depth=3, width=8, batch=4, elem=F64))
    first = engine.check(model, "y", ["x"])
    probes = []
    real = xcheck.independent_rows
    monkeypatch.setattr(xcheck, "independent_rows", lambda *a, **k: probes.append(1) or real(*a, **k))
    second = engine.check(model, "y", ["x"], seed=1)
    assert probes == [] and first.verdict == second.verdict == "pass"
    assert second.results[0].rows == first.results[0].rows == 4
    assert second.results[0].strategy == first.results[0].strategy
    # A freshly loaded model learns afresh.
    engine.check(engine.load(deep_chain(depth=3, width=8, batch=4, elem=F64)), "y", ["x"])
    assert probes == [1]
