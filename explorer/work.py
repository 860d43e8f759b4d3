"""The App's background work: thread workers that never touch widgets and post messages instead.

Each kind of work is a named group with `exit_on_error=False`; a failure arrives as
`Worker.StateChanged` and becomes a one-line notification, never a traceback on screen.
"""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
from textual.widgets import Input
from textual.worker import Worker, WorkerState, get_current_worker

import engine
from engine.errors import OnnxGradError

from . import messages as m
from .guard import guarded, in_background, one_line
from .jobs import CheckJob, GradientJob
from .screens.export import ExportScreen, mismatch
from .screens.step import StepScreen
from .screens.verify import VerifyScreen
from .summaries import summarize

LABELS = {"gradient": "computing gradients", "check": "verifying", "step": "tracing step mode",
          "export": "exporting", "open": "opening model", "layout": "laying out", "values": "computing values",
          "summary": "summarizing"}
# Not "step": step mode opens on its first frame, and closing it cancels the trace. Counting it
# here recomposed the main footer (hidden behind step mode) three times on the way to opening.
CANCELLABLE = ("gradient", "check", "export", "open")
TRACE_CHUNK_S = 0.1  # seconds between the chunks of frames step mode receives
FIRST_PAINT_WAIT_S = 2.0  # the tracing thread pauses until step mode is drawn, at most this long
SMALL_MODEL = 300  # nodes: up to this, values are computed as soon as the cursor lands
VALUES_DEBOUNCE_S = 0.3


@guarded
class Workers:
    """Mixed into ExplorerApp: starting work, and the handlers for what work posts back."""

    _values_timer = None
    _values_for: int | None = None  # the values_generation a pass over every value is running for
    _summarizing: tuple | None = None  # (kind, tensor, id of the array) the summary worker is on

    @property
    def status(self):
        """The main screen's status line, also while step mode or a dialog is on top of it."""
        return self.screen_stack[0].query_one("#status")

    def step_screen(self) -> StepScreen | None:
        return next((s for s in self.screen_stack if isinstance(s, StepScreen)), None)

    # --- the keys that start long work ------------------------------------------------------------
    def action_run(self) -> None:
        try:
            job = self.session.gradient_job()
        except OnnxGradError as exc:
            self.notify(str(exc), title="cannot run", severity="error")
            return
        self.run_gradient(job)

    def action_verify(self) -> None:
        if self.session.spec is None:
            self.notify(self.session.selection_error or "select y and xs first", title="cannot verify",
                        severity="error")
            return

        def done(options) -> None:
            if options is None:
                return
            try:
                job = self.session.check_job(options)
            except OnnxGradError as exc:
                self.notify(str(exc), title="cannot verify", severity="error")
                return
            self.run_check(job)

        # Auto (the default) leaves full or fast to the engine, which knows what a forward costs.
        self.push_screen(VerifyScreen(self.session.check_options, self.session.x_elements()), done)

    def action_step(self) -> None:
        s = self.session
        if s.spec is None:
            self.notify(s.selection_error or "select y and xs first", title="cannot step", severity="error")
            return
        try:
            feeds = s.feed_values()
        except OnnxGradError as exc:
            self.notify(str(exc), title="cannot step", severity="error")
            return
        self.run_trace(s.model, s.spec, feeds, s.device, s.dtype, s.generation)

    def action_export(self, what: str = "gradients") -> None:
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.session.label) or "model"
        self.push_screen(ExportScreen(stem, what), lambda r: r and self.start_export(*r))

    # --- starting work -----------------------------------------------------------------------------
    def request_values(self, names) -> None:
        if self.session is None or not names:
            return
        if self._values_timer is not None:
            self._values_timer.stop()
            self._values_timer = None
        if all(n in self.session.values for n in names):
            return
        if self._values_for == self.session.values_generation and self._work_live("values"):
            return  # the pass under way computes every value: these arrive with it
        if len(self.session.graph.nodes) <= SMALL_MODEL:
            self.call_later(self._start_values, list(names))
        else:  # debounced: a burst of arrows starts one pass, once the cursor stops
            self._values_timer = self.set_timer(VALUES_DEBOUNCE_S, lambda: self._start_values(list(names)))

    def _start_values(self, names) -> None:
        self._values_timer = None
        try:
            job = self.session.values_job(names)
        except OnnxGradError as exc:
            self.notify(str(exc), title="cannot compute values", severity="warning")
            return
        if job is None:  # fed tensors: answered at once
            self.query_one("#inspector").refresh_content()
            return
        self._values_for = job.generation if not job.names else None
        self.run_values(job)

    @in_background("values")
    def run_values(self, job) -> None:
        values = job.run()
        if not get_current_worker().is_cancelled:
            self.post_message(m.ValuesReady(job.generation, values, everything=not job.names))

    @in_background("gradient")
    def run_gradient(self, job: GradientJob) -> None:
        self.post_message(m.WorkStarted("gradient", LABELS["gradient"]))
        result, stats = job.run()
        worker = get_current_worker()
        origin = job.origin(result) if not worker.is_cancelled else None
        # The results table shows each x's gradient summarized: here, not on the UI thread.
        summaries = {n: summarize(g, lambda: worker.is_cancelled) for n, g in result.grads.items()}
        if not worker.is_cancelled:
            self.post_message(m.GradientReady(job.generation, result, stats, origin, summaries))

    @in_background("check")
    def run_check(self, job: CheckJob) -> None:
        worker = get_current_worker()
        self.post_message(m.WorkStarted("check", LABELS["check"]))

        def progress(done, total, stage=""):
            self.post_message(m.WorkProgress("check", int(done), int(total), str(stage)))

        report = job.run(progress=progress, should_stop=lambda: worker.is_cancelled)
        if not worker.is_cancelled:
            self.post_message(m.CheckReady(job.generation, report))

    @in_background("step")
    def run_trace(self, model, spec, feeds, device, dtype, generation) -> None:
        """Frames in chunks as they are traced: step mode opens on the first, long before the last."""
        from .stepper import Tracer

        worker = get_current_worker()
        self.post_message(m.WorkStarted("step", LABELS["step"]))
        tracer = Tracer(model, spec, feeds, device=device, dtype=dtype)
        chunk: list = []
        sent = None
        shown = threading.Event()

        def post(grads=None) -> None:
            nonlocal chunk, sent
            if sent is None:
                self.post_message(m.TraceReady(generation, tracer.head.extended(tuple(chunk)), tracer.total, shown))
                # The first drawing of step mode goes first: on a loaded machine the tracing thread
                # would otherwise take turns with it for the interpreter lock.
                shown.wait(FIRST_PAINT_WAIT_S)
            else:
                self.post_message(m.TraceChunk(generation, tuple(chunk), tracer.done, tracer.total, grads))
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

    def start_export(self, what: str, path: str) -> None:
        """Gather what to write now (main thread), write it in a worker."""
        s = self.session
        if (problem := mismatch(what, path)) is not None:
            self.notify(problem, title="cannot export", severity="error")
            return
        if what == "gradients" and s.gradient is None:
            self.notify("no gradients yet: press r to run first", title="nothing to export", severity="warning")
            return
        payload = {"gradients": lambda: dict(s.gradient.grads), "report": s.report,
                   "dot": lambda: (s.model, s.spec, s.view, s.gradient_stats)}
        self.run_export(what, path, payload["dot" if what == "svg" else what]())

    @in_background("export")
    def run_export(self, what: str, path: str, payload) -> None:
        self.post_message(m.WorkStarted("export", f"exporting {what}"))
        path = os.path.abspath(os.path.expanduser(path))
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise OnnxGradError(f"cannot write {path}: folder {folder} does not exist")
        if what == "gradients":
            with open(path, "wb") as fh:  # np.savez would append .npz to a name without it
                np.savez(fh, **{k: np.asarray(v) for k, v in payload.items()})
        elif what == "report":
            with open(path, "w") as fh:
                json.dump(payload, fh, indent=2, default=str)
        else:  # dot text, or an svg drawn by Graphviz dot when small and from onnxgrad's own layout when big
            model, spec, view, stats = payload
            engine.render_graph(model, path, spec, view, stats)
        self.post_message(m.ExportDone(what, path))

    @in_background("open")
    def run_open(self, path: str) -> None:
        self.post_message(m.WorkStarted("open", f"opening {os.path.basename(path)}"))
        model = engine.load(os.path.expanduser(path))
        self.post_message(m.ModelOpened(os.path.basename(model.graph.path or path), model))

    def on_inspector_summary_wanted(self, message) -> None:
        key = (message.kind, message.name, id(message.array))
        if self._summarizing == key and self._work_live("summary"):
            return
        self._summarizing = key
        self.run_summary(message.kind, message.name, message.array)

    @in_background("summary")
    def run_summary(self, kind: str, name: str, array) -> None:
        worker = get_current_worker()
        summary = summarize(array, lambda: worker.is_cancelled)
        if summary is not None and not worker.is_cancelled:
            self.post_message(m.SummaryReady(kind, name, array, summary))

    def on_summary_ready(self, message: m.SummaryReady) -> None:
        self.session.summaries.put(message.kind, message.name, message.array, message.summary)
        if self._summarizing is not None and self._summarizing[:2] == (message.kind, message.name):
            self._summarizing = None
        inspector = self.query_one("#inspector")
        if inspector.tensor == message.name:
            inspector.refresh_content()

    def on_cursor_moved(self, message: m.CursorMoved) -> None:
        """Only the tensor on screen is summarized: leaving it stops its summary."""
        if self._summarizing is not None and self._summarizing[1] != message.tensor:
            self._summarizing = None
            self.workers.cancel_group(self, "summary")

    def action_cancel(self) -> None:
        running = [w for w in self.workers if w.group in CANCELLABLE and w.is_running]
        for group in CANCELLABLE:
            self.workers.cancel_group(self, group)
        if running:
            self.status.idle("cancelled: " + ", ".join(LABELS[w.group] for w in running))
            for w in running:
                self.post_message(m.WorkFinished(w.group, "cancelled"))
            if any(w.group == "check" for w in running):
                self.query_one("#results").show_check_note("check cancelled: no verdict (v starts a new one)")

    # --- what work posts back ------------------------------------------------------------------------
    def _work_live(self, group: str) -> bool:
        """A worker of `group` is running and not cancelled (its late messages are not news)."""
        return any(w.group == group and w.is_running and not w.is_cancelled for w in self.workers)

    def on_work_started(self, message: m.WorkStarted) -> None:
        if not self._work_live(message.kind):
            return
        self.status.busy(message.label)
        self.refresh_footer(force=message.kind in CANCELLABLE)
        if message.kind == "check":  # the verdict on screen is the one being computed, or none
            self.session.check = None
            self.results_changed()
            results = self.query_one("#results")
            results.show_check_note("verifying… (esc cancels)")
            results.show_tab("verify")

    def on_work_progress(self, message: m.WorkProgress) -> None:
        if not self._work_live(message.kind):
            return
        self.status.progress(LABELS.get(message.kind, message.kind), message.done, message.total,
                                           message.stage)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        self.refresh_footer(force=worker.group in CANCELLABLE)
        if event.state == WorkerState.ERROR:
            text = one_line(worker.error)
            self.notify(text, title=f"{LABELS.get(worker.group, worker.group)} failed", severity="error",
                        timeout=12)
            self.status.idle(f"{worker.group} failed")
            self.post_message(m.WorkFinished(worker.group, "failed", text))
            if worker.group == "step" and (screen := self.step_screen()) is not None:
                screen.trace_failed(text)
            if worker.group == "layout":
                self.query_one("#graph").set_layout(None, f"no layout: {text}")
            if worker.group == "values" and self._values_for == self.session.values_generation:
                # One value that cannot be computed must not cost the others: ask per tensor.
                self._values_for, self.session.values_one_by_one = None, True
                self.request_values([self.cursor[1]] if self.cursor[1] else [])

    def _finish(self, kind: str, accepted: bool, done_text: str) -> None:
        self.status.idle(done_text if accepted else "ready (a result for old settings was dropped)")
        self.post_message(m.WorkFinished(kind, "done" if accepted else "stale"))

    def on_gradient_ready(self, message: m.GradientReady) -> None:
        ok = self.session.accept_gradient(message.generation, message.result, message.stats, message.origin,
                                          message.summaries)
        if ok:
            self.results_changed()
            self.query_one("#results").show_tab("gradients")
        origin = message.origin if ok else None
        self._finish("gradient", ok, "gradients computed" if origin is None else
                     f"NaN/Inf in the gradients, from node {origin.node!r}: n goes there")
        if origin is not None:
            self.notify(origin.message, title="NaN/Inf in the gradients (n: go to the node)", severity="warning",
                        timeout=15)

    def on_check_ready(self, message: m.CheckReady) -> None:
        ok = self.session.accept_check(message.generation, message.report)
        if ok:
            self.results_changed()
            results = self.query_one("#results")
            results.show_tab("verify")
            self.go_to_culprit(quiet=True)
            # The table takes the keys, so its rows work without a tab first; not from a dialog or
            # step mode opened meanwhile, nor from a text box being typed in (its next letters
            # would become app keys).
            if len(self.screen_stack) == 1 and not isinstance(self.focused, Input):
                results.focus_check()
        verdict = str(getattr(message.report.verdict, "value", message.report.verdict))
        self._finish("check", ok, "check cancelled: partial results" if verdict == "cancelled" else f"check: {verdict}")

    def on_values_ready(self, message: m.ValuesReady) -> None:
        if self.session.accept_values(message.generation, message.values, message.everything):
            self.query_one("#inspector").refresh_content()

    def on_trace_ready(self, message: m.TraceReady) -> None:
        if message.generation != self.session.generation:
            self.workers.cancel_group(self, "step")
            if message.shown is not None:
                message.shown.set()  # the worker waits for a screen that will not open
            self.status.idle("ready")
            self.notify("the selection or feeds changed while tracing: press s again", severity="warning")
            return
        layout = self.layouts.get(("forward", None))

        def done(node_index) -> None:
            self.workers.cancel_group(self, "step")  # the reverse pass nobody will look at
            self.status.idle("ready")
            if node_index is not None:
                self.move_cursor(node_index, None)

        # Step mode shows its own progress. The main screen's moving bar, hidden behind it, still
        # cost a full redraw of step mode per tick: on a loaded machine, seconds of the trace's time.
        self.status.idle("step mode open: tracing")
        canvas = self.screen_stack[0].query_one("#graph").canvas
        self.push_screen(StepScreen(message.trace, layout, message.total, canvas, message.shown), done)

    def on_trace_chunk(self, message: m.TraceChunk) -> None:
        screen = self.step_screen()
        if screen is None or message.generation != self.session.generation:
            self.workers.cancel_group(self, "step")
            return
        screen.add_frames(message.frames, message.done, message.total, message.grads)
        if message.grads is not None:
            self._finish("step", True, "step mode traced")

    def on_export_done(self, message: m.ExportDone) -> None:
        self.status.idle(f"exported {message.what}")
        self.notify(f"wrote {message.path}", title=f"exported {message.what}", timeout=6)
