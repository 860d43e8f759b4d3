"""A check reads sizes, magnitudes and a frontier's values from forwards that keep nothing else
(engine/verify/point.py): the numbers are those of the forward that keeps every value, and a fast
check of a sample model never runs that forward."""
from __future__ import annotations

import pytest
import torch

import engine
from engine.run.plan import Plan
from engine.verify import check
from engine.verify.absorbed import largest
from engine.verify.context import build
from engine.verify.point import forward_stats
from tests.run.test_samples import SAMPLES, _feeds, _path

CASES = ["mlp", "small_cnn", "transformer_block", "residual_fanout"]


@pytest.mark.parametrize("name", CASES)
def test_stats_are_the_kept_forwards_numbers(name):
    sample = SAMPLES[name]
    model = engine.load(_path(name))
    ctx = build(model, sample.y, sample.xs, sample.zs, _feeds(sample), None, 0, "cpu", False)
    kept = ctx.keep_plan.run_all(ctx.tensors64)
    stats = forward_stats(ctx.plan64, ctx.tensors64)
    assert stats.bytes == sum(v.numel() * v.element_size() for v in kept.values() if isinstance(v, torch.Tensor))
    floats = {n: v for n, v in kept.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    assert set(stats.largest) <= set(floats) and stats.largest
    for n, magnitude in stats.largest.items():
        assert magnitude == largest(floats[n]), n
    for x in ctx.spec.xs:
        frontier = ctx.frontier(x)
        assert all(torch.equal(a, kept[n]) for a, n in zip(ctx.values_of(frontier), frontier))


@pytest.mark.parametrize("name", CASES)
def test_fast_check_keeps_no_forwards_values(name, monkeypatch):
    sample = SAMPLES[name]

    def refused(self, inputs):
        raise AssertionError("a fast check kept every value of a forward")

    monkeypatch.setattr(Plan, "run_all", refused)
    report = check(_path(name), sample.y, sample.xs, sample.zs, feeds=_feeds(sample), mode="fast")
    assert report.verdict == "pass", report.verdict


def _memo_entries(model) -> list[dict]:
    from engine.verify.context import _PREPARED

    return [memo for _, by_extras in _PREPARED[model].values() for _, memo in by_extras.values()]


@pytest.mark.parametrize("rows, kept", [(64, True), (1100, False)])
def test_only_small_draws_outlive_a_check(rows, kept):
    """A fast check's directions and random dy are kept for the next check of the selection only
    while small: the memo lives as long as the model, and a weight-sized draw would stay with it."""
    import numpy as np
    from onnx import helper

    from engine.verify.fd import KEPT_DRAW_BYTES
    from tests.verify_models import make, vi

    cols = 2000  # 1100 x 2000 float64 directions: 17.6 MB, over the limit; 64 x 2000: 1 MB
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    proto = make([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [2, rows]), vi("w", [rows, cols])],
                 [vi("y", [2, cols])])
    model = engine.load(proto)
    feeds = {"x": np.ones((2, rows), np.float32), "w": w}
    first = check(model, "y", ["w"], ["x"], feeds=feeds, mode="fast")
    draws = [x_memo["directions"] for memo in _memo_entries(model) for x_memo in memo.values()
             if isinstance(x_memo, dict) and "directions" in x_memo]
    assert first.verdict == "pass"
    assert (rows * cols * 8 <= KEPT_DRAW_BYTES) == kept
    assert bool(draws) == kept
    again = check(model, "y", ["w"], ["x"], feeds=feeds, mode="fast")  # drawn again or reused: the same numbers
    assert [(r.analytic, r.numeric) for r in again.results] == [(r.analytic, r.numeric) for r in first.results]
