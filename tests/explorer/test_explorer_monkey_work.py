"""The weighted monkey (tests/explorer/monkey.py) on a sample: its keys make the app run, check and
step, not only move, and it raises nothing; afterwards the app still computes the right gradient.

benchmarks/monkey_explorer.py runs the same monkey for 10,000 keys on GPT-2 124M (docs/benchmarks.md).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import engine
from explorer.app import make_app
from tests import paths

from .conftest import SIZE, sample, settle, spec_app, started
from .monkey import Monkey, Targets

KEYS = 250


async def test_a_few_hundred_weighted_keys_crash_nothing_and_the_app_still_runs_right(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # exports land there
    path = sample("transformer_block.onnx")
    targets = Targets(ys=("loss",), xs=("Wq", "Wk", "W1", "ln1_scale"), feeds=("X",))
    monkey = Monkey(targets, "suite", settle_p=0.05, settle_s=3.0, macro_p=0.05, size=SIZE)
    checked = []

    async def still_runs_right(app, pilot) -> None:
        for worker in app.workers:
            worker.cancel()
        await settle(app, pilot)
        while len(app.screen_stack) > 1:  # whatever dialog or step mode is open closes with escape
            await pilot.press("escape")
            await pilot.pause()
        s = app.session
        s.select("loss", ["Wq", "W1"], [])
        app.selection_changed()
        app.query_one("#graph").focus()
        await pilot.press("r")
        await settle(app, pilot)
        assert s.gradient is not None, [n.message for n in app._notifications]
        # The engine on a model of its own, at the feeds, dims and dtype the monkey left.
        reference = engine.load(path).gradient("loss", ["Wq", "W1"], [], s.feed_values(), dtype=s.dtype, dims=s.dims)
        for x in ("Wq", "W1"):
            np.testing.assert_allclose(s.gradient.grads[x], reference.grads[x], rtol=1e-6, atol=1e-7)
        checked.append(s.dtype)

    tally = await monkey.play(lambda: make_app(path, select_from_gradient_node=False), KEYS, still_runs_right)
    assert tally.crashes == [], tally.crashes
    assert tally.keys == KEYS and checked, tally.as_dict()
    # The weights are what make the monkey worth its keys: work was done, not only refused (how much
    # of it finishes depends on timing: the last of these counts is the check's own run).
    assert tally.finished["GradientReady"] >= 2, tally.as_dict()


async def test_work_put_off_for_a_key_is_dropped_once_the_app_is_shutting_down():
    """The monkey's crash: labels handed over while a key was answered were applied on the App's
    timer after the screens were gone (NoMatches: EntryList on NodeList)."""
    app = spec_app()
    pending = []
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        node_list = app.query_one("#node-list")
        app.set_timer = lambda delay, callback: pending.append(callback)  # fired below, after the app closed
        app.foreground.begin()  # a key is being answered: the labels wait for its frame
        node_list.on_node_list_labelled(type(node_list).Labelled(node_list.query_one("#node-options").names, 40, {}))
        app.foreground.end()
        assert len(pending) == 1 and app.put_off == 1
    for callback in pending:
        callback()
    assert app.put_off == 0


async def test_garbage_left_when_a_later_layout_arrives_stays_collectable():
    """Only a model's first layout freezes what is alive (the model, the layout): a later view's
    layout froze closed step traces and replaced reports with it, for good (issue 35's monkey)."""
    import gc
    import weakref

    from explorer.graph_work import OTHER_LAYOUTS_KEPT

    class Held:  # stands for a closed step mode's trace: garbage in a reference cycle
        pass

    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        frozen = gc.get_freeze_count()
        assert frozen > 0 and app.session.spec is not None
        app.foreground._last_input = float("inf")  # as under keys that never stop: the app's collector waits
        held = Held()
        held.cycle = held
        gone = weakref.ref(held)
        del held
        app.query_one("#graph").focus()
        for _ in range(2):  # the backward and combined views: two more layouts
            await pilot.press("g")
            await settle(app, pilot)
        assert len(app.layouts) == 3
        gc.collect()
        assert gone() is None
        assert gc.get_freeze_count() <= frozen  # nothing more frozen (what was may have been freed)
        s = app.session
        for i in range(OTHER_LAYOUTS_KEPT + 2):  # a new selection per layout: older ones are dropped
            s.select(s.y, s.xs, s.zs[: i % 2])
            app.selection_changed()
            await settle(app, pilot)
        assert sum(1 for view, spec in app.layouts if spec is not None) <= OTHER_LAYOUTS_KEPT
        assert ("forward", None) in app.layouts


def test_a_freed_big_block_goes_back_to_the_system():
    """In a process of its own: the threshold, once held, stays held (tests/conftest.py)."""
    import subprocess
    import sys

    code = """
import numpy as np
from explorer import allocator
if not allocator.hold_mmap_threshold():
    print("SKIP")
    raise SystemExit
before = allocator.resident_bytes()
block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
grown = allocator.resident_bytes() - before
del block
allocator.trim()
print(grown, allocator.resident_bytes() - before)
"""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=str(paths.ROOT)).stdout.split()
    if out == ["SKIP"]:
        pytest.skip("not glibc: the allocator's settings are its own")
    grown, left = map(int, out)
    assert grown > 60 << 20 and left < 8 << 20


def test_every_job_shares_the_feed_values_until_the_feeds_change(spec_model):
    """A random feed of GPT-2's embedding is 147 MB: made once, not once per run, check, trace and values pass."""
    from explorer.feeding import FeedSource
    from explorer.state import Session

    s = Session(spec_model, "spec")
    s.select_from_gradient_node()
    s.set_feed("W", FeedSource("random", seed=4))
    run, check = s.gradient_job(), s.check_job()
    assert run.feeds["W"] is check.feeds["W"] and run.feeds["X"] is check.feeds["X"]
    s.set_feed("W", FeedSource("random", seed=5))  # new feeds: new values, the old ones are the old job's
    changed = s.gradient_job().feeds["W"]
    assert changed is not run.feeds["W"] and not np.array_equal(changed, run.feeds["W"])
    np.testing.assert_array_equal(changed, Session(spec_model, "fresh", feeds={"W": FeedSource("random", seed=5)})
                                  .feed_values()["W"])
    s.feeds["W"] = FeedSource("zeros")  # set behind set_feed's back (a test does): still seen
    assert not s.gradient_job().feeds["W"].any()


def test_a_pass_over_every_value_is_sized_at_the_dims_set(monkeypatch):
    """Counted with symbolic dims at 1, GPT-2 at batch 40 and seq 32 would have held every value of one pass."""
    from explorer import state
    from explorer.jobs import intermediate_bytes

    from ..feed_models import matmul_model

    model = engine.load(matmul_model("batch"))
    assert intermediate_bytes(model.graph, {"batch": 1000}) == 1000 * intermediate_bytes(model.graph) == 1000 * 8 * 3
    monkeypatch.setattr(state, "VALUES_BUDGET", 1000)
    s = state.Session(model, "matmul")
    assert s.values_job(["Y"]).names == ()  # 24 bytes: one pass keeps every value
    s.set_dims({"batch": 1000})
    assert s.values_job(["Y"]).names == ("Y",)  # 24 kB: asked for by name


async def test_a_values_pass_waits_for_the_last_one_to_let_go():
    """A cancelled thread worker's thread runs to its end: under a burst of keys on GPT-2 several
    values passes (each holding a forward pass's values) ran at once. A new one waits its turn."""
    import time

    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        s, work = app.session, app.work
        tensor = next(t for t in s.graph.producer if t not in s.values)
        work.threads["values"] = 1  # a pass whose worker was cancelled, its thread still computing
        work.request_values([tensor])
        await pilot.pause(0.5)
        assert tensor not in s.values and not any(w.group == "values" for w in app.workers)
        assert work.values_timer is not None  # it looks again
        work.threads["values"] = 0  # that thread ended
        t0 = time.monotonic()
        while tensor not in s.values and time.monotonic() - t0 < 10:
            await pilot.pause(0.05)
        assert tensor in s.values
        from engine import examples

        fresh = engine.load(examples.spec_conv_gemm()).run(s.feed_values(), outputs=[tensor])
        np.testing.assert_array_equal(s.values[tensor], fresh[tensor])


async def test_a_run_waits_for_the_last_runs_thread_to_end():
    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.work.threads["gradient"] = 1  # a run cancelled by escape, its thread still computing
        app.query_one("#graph").focus()
        await pilot.press("r")
        await pilot.pause(0.3)
        assert app.session.gradient is None and app.put_off >= 1
        assert not any(w.group == "gradient" for w in app.workers)
        app.work.threads["gradient"] = 0
        await settle(app, pilot)
        s = app.session
        assert s.gradient is not None
        reference = s.model.gradient(s.spec.y, s.spec.xs, s.spec.zs, s.feed_values())
        for x in s.spec.xs:
            np.testing.assert_array_equal(s.gradient.grads[x], reference.grads[x])


async def test_two_enters_in_one_burst_close_a_dialog_once(tmp_path, monkeypatch):
    """The 10,000-key monkey's crash on GPT-2: the second Enter dismissed the closed dialog again and
    Textual popped the main screen (ScreenStackError). Sent to the driver at once, as a fast typist's."""
    from .monkey import key_event

    monkeypatch.chdir(tmp_path)  # the export dialog's Enter writes a file
    for opener in ("f", "e", "v"):
        app = spec_app()
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            app.query_one("#graph").focus()
            await pilot.press(opener)
            await pilot.pause()
            assert len(app.screen_stack) == 2, opener
            for key in ("enter", "enter"):
                app._driver.send_message(key_event(key))
            await pilot.pause(0.3)
            await settle(app, pilot)
            assert app.is_running and len(app.screen_stack) == 1, opener
        assert app._exception is None, opener


async def test_a_closed_app_leaves_nothing_frozen():
    """Each app freezes its model out of the collector; once it closes, what it froze is collectable
    again (the monkey's app after a crash, and every test's app, kept the one before for good)."""
    import gc

    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
