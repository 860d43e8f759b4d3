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
