"""Diff mode: `b` opens the diff dialog, a worker runs `engine.diff` and posts `DiffReady`; the graph
and the navigator colour nodes by their divergence, forward or gradient (`B` switches), `n` goes to
the culprit, the inspector shows A's and B's values. Leaving it (`b`, or the palette) returns to the
normal view. The state read by the panes is `session.diff` (diff_state.DiffShown)."""
from __future__ import annotations

from typing import Callable, Protocol

from textual.worker import Worker, get_current_worker

from engine.errors import OnnxGradError

from . import messages as m
from .diff_state import AGAINST, HALF_TYPES, DiffChoice, DiffShown, diff_job
from .host import Shown, Ui, in_thread, status_line
from .screens.diff import AGAIN, LEAVE, DiffScreen

GROUP = "diff"  # the worker group: esc cancels it like the other long work (work.CANCELLABLE)


class DiffingApp(Ui, Protocol):
    workers: object

    def run_worker(self, work, **kwargs): ...

    def results_changed(self) -> None: ...

    def refresh_footer(self, force: bool = False) -> None: ...

    def go_to_culprit(self, quiet: bool = False) -> None: ...

    def call_after_refresh(self, callback: Callable, *args) -> bool: ...


class Diffing:
    """Starts diffs, takes their reports in and switches what diff mode shows."""

    def __init__(self, shown: Shown, app: DiffingApp):
        self.shown, self.app = shown, app
        self.last_b = ""  # the dialog offers the file compared last

    def act(self, what: str = "open") -> None:
        """The `diff` action: "open" (the dialog), "where" (forward/gradient), "leave", or a direct
        comparison from the palette: "float16", "bfloat16", "onnxruntime"."""
        actions: dict[str, Callable[[], None]] = {"open": self.open, "where": self.toggle_where, "leave": self.leave}
        if what in actions:
            actions[what]()
        elif what in HALF_TYPES:
            self.start(DiffChoice(dtype=what))
        elif what == AGAINST:
            self.start(DiffChoice(against=AGAINST))
        else:
            raise ValueError(f"unknown diff action {what!r}: choose open, where, leave, {', '.join(HALF_TYPES)}, {AGAINST}")

    @property
    def diff(self) -> DiffShown | None:
        s = self.shown.session
        return None if s is None else s.diff

    def open(self) -> None:
        s = self.shown.session
        if s.spec is not None:
            compares = f"compares the forward and the gradient of y {s.spec.y} for xs {', '.join(s.spec.xs)}"
        else:
            compares = "compares the forward only: select y and xs first (y, x) to compare gradients too"
        shown = self.diff.label if self.diff is not None else None
        stale = self.diff is not None and self.diff.stale(s)
        self.app.push_screen(DiffScreen(compares, shown, self.last_b, stale), self._chosen)

    def _chosen(self, choice) -> None:
        if choice == LEAVE:
            self.leave()
        elif choice == AGAIN and self.diff is not None:
            self.start(self.diff.choice)
        elif isinstance(choice, DiffChoice):
            self.start(choice)

    def start(self, choice: DiffChoice) -> Worker | None:
        if choice.b:
            self.last_b = choice.b
        try:
            job = diff_job(self.shown.session, choice)
        except OnnxGradError as exc:  # the session's feeds or dims cannot be made
            self.app.notify(str(exc), title="cannot diff", severity="error")
            return None
        return in_thread(self.app, GROUP, self._diff, job)

    def _diff(self, job) -> None:
        self.app.post_message(m.WorkStarted(GROUP, f"diff {job.choice.describe()}"))
        report = job.run()
        if not get_current_worker().is_cancelled:
            self.app.post_message(m.DiffReady(job.model, report, job.choice, job.basis))

    def ready(self, message: m.DiffReady) -> None:
        s = self.shown.session
        if s is None or message.model is not s.model:  # another model was opened meanwhile
            return
        s.diff = DiffShown.of(message.report, message.choice, message.basis)
        self._redraw()
        self.app.query_one("#results").show_tab("diff")
        headline = s.diff.headline()
        status_line(self.app).idle(f"diff: {headline}")
        self.app.post_message(m.WorkFinished(GROUP, "done"))
        first = message.report.first_divergence
        self.app.notify(headline + ("; n goes there" if first is not None else ""), title=f"diff {s.label} {s.diff.label}",
                        severity="warning" if first is not None else "information", timeout=10)
        if first is not None:  # once the bar's diff line has taken its row: the graph's height is known then
            self.app.call_after_refresh(self.app.go_to_culprit, True)

    def toggle_where(self) -> None:
        diff = self.diff
        if diff is None:
            self.app.notify("no diff shown: b compares this model with another", severity="warning", timeout=3)
            return
        if not diff.has_gradient:
            self.app.notify("this diff compared the forward only: select y and xs, then b, to compare gradients",
                            severity="warning", timeout=6)
            return
        self.show_where(diff.toggle())
        self.app.notify(f"diff colours show the {diff.where} divergence", timeout=2)

    def show_where(self, where: str) -> None:
        """Colour by `where` ("forward" or "gradient"): `n` switches to its culprit's direction."""
        if self.diff is not None:
            self.diff.where = where
            self._redraw()

    def leave(self) -> None:
        s = self.shown.session
        if s is None or s.diff is None:
            return
        s.diff = None
        self._redraw()
        status_line(self.app).idle("diff mode left")

    def _redraw(self) -> None:
        self.app.results_changed()  # the marks in the graph and the list, the inspector, the Diff tab
