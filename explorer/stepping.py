"""Step mode from the main screen: the trace made in a worker, step mode opened on its first frame
and fed the rest in chunks."""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from textual.worker import get_current_worker

from engine.errors import OnnxGradError

from . import messages as m
from .host import Shown, Ui, in_thread, status_line
from .screens.step import StepScreen
from .work import LABELS, finish, step_screen

TRACE_CHUNK_S = 0.1  # seconds between the chunks of frames step mode receives
FIRST_PAINT_WAIT_S = 2.0  # the tracing thread pauses until step mode is drawn, at most this long


class SteppingApp(Ui, Protocol):
    workers: object  # textual's WorkerManager: cancel_group
    screen_stack: list

    def run_worker(self, work, **kwargs): ...

    def move_cursor(self, node_index: int | None, tensor: str | None) -> None: ...


class Stepping:
    """The `s` key, and what the tracing worker posts. `forward_layout()` is the forward view's whole
    layout when made (step mode draws it), else None."""

    def __init__(self, shown: Shown, app: SteppingApp, forward_layout: Callable[[], object]):
        self.shown, self.app, self.forward_layout = shown, app, forward_layout

    def step(self) -> None:
        s = self.shown.session
        if s.spec is None:
            self.app.notify(s.selection_error or "select y and xs first", title="cannot step", severity="error")
            return
        try:
            feeds = s.feed_values()
        except OnnxGradError as exc:
            self.app.notify(str(exc), title="cannot step", severity="error")
            return
        self.run_trace(s.model, s.spec, feeds, s.device, s.dtype, s.generation)

    def run_trace(self, model, spec, feeds, device, dtype, generation):
        return in_thread(self.app, "step", self._trace, model, spec, feeds, device, dtype, generation)

    def _trace(self, model, spec, feeds, device, dtype, generation) -> None:
        """Frames in chunks as they are traced: step mode opens on the first, long before the last."""
        from .stepper import Tracer

        worker = get_current_worker()
        self.app.post_message(m.WorkStarted("step", LABELS["step"]))
        tracer = Tracer(model, spec, feeds, device=device, dtype=dtype)
        chunk: list = []
        sent = None
        shown = threading.Event()

        def post(grads=None) -> None:
            nonlocal chunk, sent
            if sent is None:
                self.app.post_message(m.TraceReady(generation, tracer.head.extended(tuple(chunk)), tracer.total, shown))
                # The first drawing of step mode goes first: on a loaded machine the tracing thread
                # would otherwise take turns with it for the interpreter lock.
                shown.wait(FIRST_PAINT_WAIT_S)
            else:
                self.app.post_message(m.TraceChunk(generation, tuple(chunk), tracer.done, tracer.total, grads))
            chunk, sent = [], time.monotonic()

        def emit(frame) -> None:
            chunk.append(frame)
            # By time, not count: a frame the user waits on shows within a tenth of a second, and
            # the screen is not redrawn per frame. The first frame opens step mode.
            if sent is None or time.monotonic() - sent >= TRACE_CHUNK_S:
                post()

        def forward_done() -> None:  # all forward frames before the first reverse node is computed
            if chunk:
                post()

        tracer.run(emit, lambda: worker.is_cancelled, forward_done)
        if worker.is_cancelled:
            return
        if sent is None:  # not a single frame: step mode opens to say so
            post()
        post(tracer.grads)

    def trace_ready(self, message: m.TraceReady) -> None:
        if message.generation != self.shown.session.generation:
            self.app.workers.cancel_group(self.app, "step")
            if message.shown is not None:
                message.shown.set()  # the worker waits for a screen that will not open
            status_line(self.app).idle("ready")
            self.app.notify("the selection or feeds changed while tracing: press s again", severity="warning")
            return
        layout = self.forward_layout()

        def done(node_index) -> None:
            self.app.workers.cancel_group(self.app, "step")  # the reverse pass nobody will look at
            status_line(self.app).idle("ready")
            if node_index is not None:
                self.app.move_cursor(node_index, None)

        # Step mode shows its own progress. The main screen's moving bar, hidden behind it, still
        # cost a full redraw of step mode per tick: on a loaded machine, seconds of the trace's time.
        status_line(self.app).idle("step mode open: tracing")
        canvas = self.app.screen_stack[0].query_one("#graph").canvas
        self.app.push_screen(StepScreen(message.trace, layout, message.total, canvas, message.shown), done)

    def trace_chunk(self, message: m.TraceChunk) -> None:
        screen = step_screen(self.app.screen_stack)
        if screen is None or message.generation != self.shown.session.generation:
            self.app.workers.cancel_group(self.app, "step")
            return
        screen.add_frames(message.frames, message.done, message.total, message.grads)
        if message.grads is not None:
            finish(self.app, "step", True, "step mode traced")
