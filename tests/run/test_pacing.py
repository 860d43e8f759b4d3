"""engine.run.pacing: the engine's long Python loops call a front end's pause hook, in the thread doing the work."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import engine
from engine.run import pacing
from tests.big_models import residual_chain


@pytest.fixture
def calls():
    seen: list[int] = []
    before = engine.set_pause_hook(lambda: seen.append(threading.get_ident()))
    try:
        yield seen
    finally:
        engine.set_pause_hook(before)


def test_no_hook_is_the_default_and_a_pause_point_does_nothing():
    assert pacing._hook is None
    engine.pause_point()


def test_set_pause_hook_returns_the_one_before():
    first, second = (lambda: None), (lambda: None)
    assert engine.set_pause_hook(first) is None
    assert engine.set_pause_hook(second) is first
    assert engine.set_pause_hook(None) is second


def test_a_layout_and_a_forward_pass_pause_often_in_the_thread_that_runs_them(calls):
    model = engine.load(residual_chain(200))  # 801 nodes
    layout = engine.layout_graph(model, None, view="forward", engine="layered")
    assert len(layout.nodes) > 800
    in_layout = len(calls)
    assert in_layout >= 50  # per layer of the ordering sweeps, per few placements, per edge routed
    engine.Canvas(layout)
    assert len(calls) > in_layout
    done = []
    worker = threading.Thread(target=lambda: done.append(model.run_all({"input": np.ones((1, 2, 4, 4), np.float32)})))
    calls.clear()
    worker.start()
    worker.join()
    assert done and len(done[0]) > 800
    assert len(calls) >= 801 and set(calls) == {worker.ident}  # a step each, in the worker's thread


def test_the_explorers_gradient_pauses_in_its_backward_pass_too(calls):
    from engine.gradient.prepared import GradientResult

    model = engine.load(residual_chain(20))  # 81 nodes
    calls.clear()
    result, stats = engine.gradient_with_stats(model, "loss", ["block0.conv.weight"], ["input"],
                                               {"input": np.ones((1, 2, 4, 4), np.float32)})
    assert isinstance(result, GradientResult)
    reached = sum(s is not None for s in stats.tensors.values())
    assert reached > 80  # every tensor from block 0's conv on has a gradient
    assert len(calls) >= len(model.graph.nodes) + reached  # a step each forward, a gradient each backward


def test_paced_yields_every_item_and_pauses_before_each_every_th(calls):
    seen = []
    for item in engine.paced(iter(range(10)), 4):
        seen.append((item, len(calls)))
    # a pause before items 0, 4 and 8: each item sees the pauses made before it
    assert seen == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (7, 2), (8, 3), (9, 3)]
    assert list(engine.paced([])) == [] and len(calls) == 3
