"""The App's background work: thread workers that never touch widgets and post messages instead.

Each kind of work is a named group with `exit_on_error=False`; a failure arrives as
`Worker.StateChanged` and becomes a one-line notification, never a traceback on screen.
Step mode's tracing is in stepping.py, the graph's layouts in graph_work.py.
"""
from __future__ import annotations

import json
import os
import threading
from collections import Counter
from typing import Callable, Protocol

import numpy as np
from textual.widgets import Input
from textual.worker import Worker, WorkerState, get_current_worker

import engine
from engine.errors import OnnxGradError

from . import messages as m
from .guard import one_line, release_frames
from .host import Shown, Ui, in_thread, status_line
from .jobs import CheckJob, GradientJob
from .screens.export import ExportScreen, mismatch
from .screens.step import StepScreen
from .screens.verify import VerifyScreen
from .summaries import summarize

LABELS = {"gradient": "computing gradients", "check": "verifying", "step": "tracing step mode",
          "export": "exporting", "open": "opening model", "layout": "laying out", "values": "computing values",
          "summary": "summarizing", "diff": "comparing models"}
# Not "step": step mode opens on its first frame, and closing it cancels the trace. Counting it
# here recomposed the main footer (hidden behind step mode) three times on the way to opening.
CANCELLABLE = ("gradient", "check", "export", "open", "diff")
SMALL_MODEL = 300  # nodes: up to this, values are computed as soon as the cursor lands
VALUES_DEBOUNCE_S = 0.3


class WorkApp(Ui, Protocol):
    workers: object  # textual's WorkerManager: iterated, cancel_group
    screen_stack: list
    focused: object

    def run_worker(self, work, **kwargs): ...

    def call_later(self, callback: Callable, *args) -> bool: ...

    def set_timer(self, delay: float, callback: Callable): ...

    def results_changed(self) -> None: ...

    def refresh_footer(self, force: bool = False) -> None: ...

    def go_to_culprit(self, quiet: bool = False) -> None: ...

    def put_off_for(self, owner, delay: float, callback: Callable) -> None: ...


def live(app, group: str) -> bool:
    """A worker of `group` is running and not cancelled (its late messages are not news)."""
    return any(w.group == group and w.is_running and not w.is_cancelled for w in app.workers)


def finish(app, kind: str, accepted: bool, done_text: str) -> None:
    status_line(app).idle(done_text if accepted else "ready (a result for old settings was dropped)")
    app.post_message(m.WorkFinished(kind, "done" if accepted else "stale"))


def step_screen(screen_stack) -> StepScreen | None:
    return next((s for s in screen_stack if isinstance(s, StepScreen)), None)


class Work:
    """Starts gradients, checks, values, summaries, exports and model opening in workers, and takes
    in what they post back: into the session, onto the status line and the results."""

    def __init__(self, shown: Shown, app: WorkApp):
        self.shown, self.app = shown, app
        self.values_timer = None
        self.values_for: int | None = None  # the values_generation a pass over every value is running for
        self.summarizing: tuple | None = None  # (kind, tensor, id of the array) the summary worker is on
        # Threads still running per group, cancelled or not: a cancelled thread worker's thread runs to
        # its end, and under a burst of keys on GPT-2 several values passes (or gradients) each held a
        # forward pass's values at once. A new one of these groups waits for the last to end.
        self.threads: Counter = Counter()
        self._threads_lock = threading.Lock()

    # --- the keys that start long work ------------------------------------------------------------
    def run(self) -> None:
        try:
            job = self.shown.session.gradient_job()
        except OnnxGradError as exc:
            self.app.notify(str(exc), title="cannot run", severity="error")
            return
        self.run_gradient(job)

    def verify(self) -> None:
        s = self.shown.session
        if s.spec is None:
            self.app.notify(s.selection_error or "select y and xs first", title="cannot verify", severity="error")
            return

        def done(options) -> None:
            if options is None:
                return
            try:
                job = self.shown.session.check_job(options)
            except OnnxGradError as exc:
                self.app.notify(str(exc), title="cannot verify", severity="error")
                return
            self.run_check(job)

        # Auto (the default) leaves full or fast to the engine, which knows what a forward costs.
        self.app.push_screen(VerifyScreen(s.check_options, s.x_elements()), done)

    def export(self, what: str = "gradients") -> None:
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.shown.session.label) or "model"
        self.app.push_screen(ExportScreen(stem, what), lambda r: r and self.start_export(*r))

    def cancel(self) -> None:
        running = [w for w in self.app.workers if w.group in CANCELLABLE and w.is_running]
        for group in CANCELLABLE:
            self.app.workers.cancel_group(self.app, group)
        if running:
            status_line(self.app).idle("cancelled: " + ", ".join(LABELS[w.group] for w in running))
            for w in running:
                self.app.post_message(m.WorkFinished(w.group, "cancelled"))
            if any(w.group == "check" for w in running):
                self.app.query_one("#results").show_check_note("check cancelled: no verdict (v starts a new one)")

    def cancellable(self) -> bool:
        return any(w.group in CANCELLABLE and w.is_running for w in self.app.workers)

    # --- starting work -----------------------------------------------------------------------------
    def request_values(self, names) -> None:
        s = self.shown.session
        if s is None or not names:
            return
        if self.values_timer is not None:
            self.values_timer.stop()
            self.values_timer = None
        if all(n in s.values for n in names):
            return
        if self.values_for == s.values_generation and live(self.app, "values"):
            return  # the pass under way computes every value: these arrive with it
        if len(s.graph.nodes) <= SMALL_MODEL:
            self.app.call_later(self._start_values, list(names))
        else:  # debounced: a burst of arrows starts one pass, once the cursor stops
            self.values_timer = self.app.set_timer(VALUES_DEBOUNCE_S, lambda: self._start_values(list(names)))

    def _start_values(self, names) -> None:
        self.values_timer = None
        if self.threads["values"]:  # the last pass (cancelled, or the cursor moved on) has not let go yet
            self.values_timer = self.app.set_timer(VALUES_DEBOUNCE_S, lambda: self._start_values(names))
            return
        try:
            job = self.shown.session.values_job(names)
        except OnnxGradError as exc:
            self.app.notify(str(exc), title="cannot compute values", severity="warning")
            return
        if job is None:  # fed tensors: answered at once
            self.app.query_one("#inspector").refresh_content()
            return
        self.values_for = job.generation if not job.names else None
        self.run_values(job)

    def start_export(self, what: str, path: str) -> None:
        """Gather what to write now (main thread), write it in a worker."""
        s = self.shown.session
        if (problem := mismatch(what, path)) is not None:
            self.app.notify(problem, title="cannot export", severity="error")
            return
        if what == "gradients" and s.gradient is None:
            self.app.notify("no gradients yet: press r to run first", title="nothing to export", severity="warning")
            return
        payload = {"gradients": lambda: dict(s.gradient.grads), "report": s.report,
                   "dot": lambda: (s.model, s.spec, s.view, s.gradient_stats)}
        self.run_export(what, path, payload["dot" if what == "svg" else what]())

    def summary_wanted(self, kind: str, name: str, array) -> None:
        key = (kind, name, id(array))
        if self.summarizing == key and live(self.app, "summary"):
            return
        self.summarizing = key
        self.run_summary(kind, name, array)

    def cursor_moved(self, tensor: str | None) -> None:
        """Only the tensor on screen is summarized: leaving it stops its summary."""
        if self.summarizing is not None and self.summarizing[1] != tensor:
            self.summarizing = None
            self.app.workers.cancel_group(self.app, "summary")

    def run_values(self, job) -> Worker:
        return in_thread(self.app, "values", self._values, job)

    def run_gradient(self, job: GradientJob) -> Worker | None:
        if self.threads["gradient"]:  # the last run's thread (cancelled by this one) goes first
            self.app.workers.cancel_group(self.app, "gradient")
            self.app.put_off_for(self.app, VALUES_DEBOUNCE_S, lambda: self.run_gradient(job))  # counted: tests wait
            return None
        return in_thread(self.app, "gradient", self._gradient, job)

    def run_check(self, job: CheckJob) -> Worker:
        return in_thread(self.app, "check", self._check, job)

    def run_export(self, what: str, path: str, payload) -> Worker:
        return in_thread(self.app, "export", self._export, what, path, payload)

    def run_open(self, path: str) -> Worker:
        return in_thread(self.app, "open", self._open, path)

    def run_summary(self, kind: str, name: str, array) -> Worker:
        return in_thread(self.app, "summary", self._summary, kind, name, array)

    # --- in the workers' threads -----------------------------------------------------------------------
    def _counted(self, group: str, fn, *args):
        with self._threads_lock:
            self.threads[group] += 1
        try:
            return fn(*args)
        finally:
            with self._threads_lock:
                self.threads[group] -= 1

    def _values(self, job) -> None:
        values = self._counted("values", job.run)
        if not get_current_worker().is_cancelled:
            self.app.post_message(m.ValuesReady(job.generation, values, everything=not job.names))

    def _gradient(self, job: GradientJob) -> None:
        self._counted("gradient", self._compute_gradient, job)

    def _compute_gradient(self, job: GradientJob) -> None:
        self.app.post_message(m.WorkStarted("gradient", LABELS["gradient"]))
        result, stats = job.run()
        worker = get_current_worker()
        origin = job.origin(result) if not worker.is_cancelled else None
        # The results table shows each x's gradient summarized: here, not on the UI thread.
        summaries = {n: summarize(g, lambda: worker.is_cancelled) for n, g in result.grads.items()}
        if not worker.is_cancelled:
            self.app.post_message(m.GradientReady(job.generation, result, stats, origin, summaries))

    def _check(self, job: CheckJob) -> None:
        worker = get_current_worker()
        self.app.post_message(m.WorkStarted("check", LABELS["check"]))

        def progress(done, total, stage=""):
            self.app.post_message(m.WorkProgress("check", int(done), int(total), str(stage)))

        report = job.run(progress=progress, should_stop=lambda: worker.is_cancelled)
        if not worker.is_cancelled:
            self.app.post_message(m.CheckReady(job.generation, report))

    def _export(self, what: str, path: str, payload) -> None:
        self.app.post_message(m.WorkStarted("export", f"exporting {what}"))
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
        self.app.post_message(m.ExportDone(what, path))

    def _open(self, path: str) -> None:
        self.app.post_message(m.WorkStarted("open", f"opening {os.path.basename(path)}"))
        model = engine.load(os.path.expanduser(path))
        self.app.post_message(m.ModelOpened(os.path.basename(model.graph.path or path), model))

    def _summary(self, kind: str, name: str, array) -> None:
        worker = get_current_worker()
        summary = summarize(array, lambda: worker.is_cancelled)
        if summary is not None and not worker.is_cancelled:
            self.app.post_message(m.SummaryReady(kind, name, array, summary))

    # --- what work posts back ------------------------------------------------------------------------
    def started(self, message: m.WorkStarted) -> None:
        if not live(self.app, message.kind):
            return
        status_line(self.app).busy(message.label)
        self.app.refresh_footer(force=message.kind in CANCELLABLE)
        if message.kind == "check":  # the verdict on screen is the one being computed, or none
            self.shown.session.check = None
            self.app.results_changed()
            results = self.app.query_one("#results")
            results.show_check_note("verifying… (esc cancels)")
            results.show_tab("verify")

    def progress(self, message: m.WorkProgress) -> None:
        if live(self.app, message.kind):
            status_line(self.app).progress(LABELS.get(message.kind, message.kind), message.done, message.total,
                                           message.stage)

    def state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        self.app.refresh_footer(force=worker.group in CANCELLABLE)
        if event.state != WorkerState.ERROR:
            return
        text = one_line(worker.error)
        # Its thread has ended: the frames it was still in when releasing() cleared the others
        # (Textual's, holding the Worker and the job with its feeds) keep a cycle with the error.
        release_frames(worker.error)
        self.app.notify(text, title=f"{LABELS.get(worker.group, worker.group)} failed", severity="error", timeout=12)
        status_line(self.app).idle(f"{worker.group} failed")
        self.app.post_message(m.WorkFinished(worker.group, "failed", text))
        if worker.group == "step" and (screen := step_screen(self.app.screen_stack)) is not None:
            screen.trace_failed(text)
        if worker.group == "layout":
            self.app.query_one("#graph").set_layout(None, f"no layout: {text}")
        if worker.group == "values" and self.values_for == self.shown.session.values_generation:
            # One value that cannot be computed must not cost the others: ask per tensor.
            self.values_for, self.shown.session.values_one_by_one = None, True
            tensor = self.shown.cursor[1]
            self.request_values([tensor] if tensor else [])

    def gradient_ready(self, message: m.GradientReady) -> None:
        ok = self.shown.session.accept_gradient(message.generation, message.result, message.stats, message.origin,
                                                message.summaries)
        if ok:
            self.app.results_changed()
            self.app.query_one("#results").show_tab("gradients")
        origin = message.origin if ok else None
        finish(self.app, "gradient", ok, "gradients computed" if origin is None else
               f"NaN/Inf in the gradients, from node {origin.node!r}: n goes there")
        if origin is not None:
            self.app.notify(origin.message, title="NaN/Inf in the gradients (n: go to the node)", severity="warning",
                            timeout=15)

    def check_ready(self, message: m.CheckReady) -> None:
        ok = self.shown.session.accept_check(message.generation, message.report)
        if ok:
            self.app.results_changed()
            results = self.app.query_one("#results")
            results.show_tab("verify")
            self.app.go_to_culprit(quiet=True)
            # The table takes the keys, so its rows work without a tab first; not from a dialog or
            # step mode opened meanwhile, nor from a text box being typed in (its next letters
            # would become app keys).
            if len(self.app.screen_stack) == 1 and not isinstance(self.app.focused, Input):
                results.focus_check()
        verdict = str(getattr(message.report.verdict, "value", message.report.verdict))
        finish(self.app, "check", ok, "check cancelled: partial results" if verdict == "cancelled" else f"check: {verdict}")

    def values_ready(self, message: m.ValuesReady) -> None:
        if self.shown.session.accept_values(message.generation, message.values, message.everything):
            self.app.query_one("#inspector").refresh_content()

    def summary_ready(self, message: m.SummaryReady) -> None:
        self.shown.session.summaries.put(message.kind, message.name, message.array, message.summary)
        if self.summarizing is not None and self.summarizing[:2] == (message.kind, message.name):
            self.summarizing = None
        inspector = self.app.query_one("#inspector")
        if inspector.tensor == message.name:
            inspector.refresh_content()

    def export_done(self, message: m.ExportDone) -> None:
        status_line(self.app).idle(f"exported {message.what}")
        self.app.notify(f"wrote {message.path}", title=f"exported {message.what}", timeout=6)
