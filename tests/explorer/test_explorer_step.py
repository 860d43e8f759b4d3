"""Step mode opens on the first frames while the rest is traced: waiting, catching up, cancelling.

The reverse pass is held at a gate (the per-node VJP waits on an Event), so each test sees the
screen in the state a slow trace leaves it in, then releases the gate.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import engine
from explorer import messages as m
from explorer import stepper
from explorer.screens.step import StepScreen
from explorer.stepper import trace

from .conftest import DENSENET, of_type, opened, plain, settle, spec_app

GATE_TIMEOUT_S = 60  # a ceiling that only a freeze reaches


@pytest.fixture
def gate(monkeypatch):
    """An Event the reverse pass waits on before each node's VJP."""
    event = threading.Event()
    vjp = stepper._vjp

    def gated(*args, **kwargs):
        assert event.wait(GATE_TIMEOUT_S), "the test never opened the gate"
        return vjp(*args, **kwargs)

    monkeypatch.setattr(stepper, "_vjp", gated)
    yield event
    event.set()  # never leave a worker thread blocked


async def _open_step(app, pilot) -> StepScreen:
    await pilot.press("s")
    for _ in range(500):
        if isinstance(app.screen, StepScreen) and len(app.screen.trace.frames) == app.screen.trace.forward_count:
            break
        await pilot.pause(0.02)
    await pilot.pause()
    return app.screen


def _reference(app):
    s = app.session
    return trace(s.model, s.spec, s.feed_values(), device=s.device, dtype=s.dtype)


async def test_step_mode_opens_before_the_reverse_pass_and_waits_for_the_frame_asked_for(recorded, gate):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        screen = await _open_step(app, pilot)
        assert isinstance(screen, StepScreen) and not screen.trace.complete and screen.trace.grads is None
        n_fwd = screen.trace.forward_count
        assert [f.phase for f in screen.trace.frames] == ["forward"] * n_fwd
        assert screen.frame.phase == "forward" and "FORWARD 1/3" in plain(screen.query_one("#step-text"))
        await pilot.press(*["n"] * (n_fwd + 1))  # the second reverse frame: not traced yet
        assert screen.frame is None and screen.position == n_fwd + 1
        text = plain(screen.query_one("#step-text"))
        assert "tracing reverse pass" in text and "reverse frame 2 is shown as soon as it is traced" in text
        gate.set()
        await settle(app, pilot)
        want = _reference(app)
        assert screen.trace.complete and len(screen.trace.frames) == len(want.frames)
        shown = screen.frame
        assert (shown.phase, shown.node_index) == ("reverse", want.frames[n_fwd + 1].node_index)
        assert f"REVERSE 2/{len(want.frames) - n_fwd}" in plain(screen.query_one("#step-text"))
        graph = screen.query_one("#step-graph")
        assert graph.canvas.nodes[graph.selected].node_index == shown.node_index
        assert of_type(seen, m.TraceChunk)[-1].grads is not None


async def test_end_before_the_trace_is_complete_lands_on_the_last_frame_once_it_is(gate):
    app = spec_app()
    async with opened(app) as pilot:
        screen = await _open_step(app, pilot)
        await pilot.press("end")
        assert screen.at_end and screen.frame is None
        assert "the last frame is shown as soon as it is traced" in plain(screen.query_one("#step-text"))
        gate.set()
        await settle(app, pilot)
        assert not screen.at_end and screen.position == len(screen.trace.frames) - 1
        assert "Done: dY/dW, dY/dZ accumulated" in plain(screen.query_one("#step-text"))
        want = _reference(app)
        for x in app.session.spec.xs:  # the same sum as the one-call trace, frame for frame
            assert (screen.trace.grads[x] == want.grads[x]).all()


async def test_closing_step_mode_cancels_the_trace(recorded, gate):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        screen = await _open_step(app, pilot)
        worker = next(w for w in app.workers if w.group == "step")
        assert worker.is_running and not worker.is_cancelled
        await pilot.press("escape")
        assert not isinstance(app.screen, StepScreen) and worker.is_cancelled
        gate.set()
        await settle(app, pilot)
        assert not worker.is_running
        assert not [c for c in of_type(seen, m.TraceChunk) if c.grads is not None]
        assert not screen.trace.complete  # the frames it had; nothing arrived after closing
        assert "tracing" not in plain(app.query_one("#status-text"))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DENSENET), reason="the onnx package ships without light models")
def test_the_taped_trace_of_densenet_adds_up_to_model_gradient():
    """Each node's backward runs on the tape its forward left: the sum must still be the engine's."""
    model = engine.load(DENSENET)
    spec = model.selection("fc6_1", ["data_0"])  # a weight in xs: both take seconds more (engine)
    got = trace(model, spec, {})
    want = model.gradient("fc6_1", ["data_0"])
    reverse = [f for f in got.frames if f.phase == "reverse"]
    assert got.forward_count == len(model.graph.nodes) and reverse and reverse[-1].op_type == "Conv"
    for x in spec.xs:
        scale = np.abs(want.grads[x]).max()
        assert scale > 0
        np.testing.assert_allclose(got.grads[x], want.grads[x], rtol=1e-4, atol=1e-4 * scale)
