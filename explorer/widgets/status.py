"""The bottom status line: what is running, how far it got with an ETA, and how to cancel it.

One line of text in a widget of fixed size. It was a label beside Textual's ProgressBar, whose
coming and going re-ran the whole screen's layout when work started and ended (what the first key
after `r` waited for on big models) and which animated at 60 frames a second meanwhile; here
the progress is drawn into the line, and an elapsed-time counter ticks twice a second.
"""
from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label

from .text import set_text

BAR_WIDTH = 20
CANCEL_HINT = "  (esc cancels)"


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """`width` cells, the first `fraction` of them full (a half cell at the edge)."""
    halves = round(max(0.0, min(1.0, fraction)) * width * 2)
    return ("━" * (halves // 2) + ("╸" if halves % 2 else "")).ljust(width)


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"


class StatusLine(Horizontal):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel-darken-1; }
    StatusLine > Label { width: 1fr; height: 1; }
    """

    _note: str | None = None
    _ticking: str | None = None  # the label of work with no progress yet: its line shows the time spent
    _started: float = 0.0  # when the running work started, for the ETA

    def compose(self) -> ComposeResult:
        yield Label("ready", id="status-text")

    def on_mount(self) -> None:
        self._ticker = self.set_interval(0.5, self._tick, pause=True)

    def busy(self, label: str) -> None:
        self._note = None
        self._ticking, self._started = label, time.monotonic()
        self._ticker.resume()
        self._tick()

    def _tick(self) -> None:
        if self._ticking is not None:
            spent = clock(time.monotonic() - self._started)
            set_text(self.query_one(Label), f"{self._ticking}…  {spent}{CANCEL_HINT}")

    def progress(self, label: str, done: int, total: int, stage: str) -> None:
        self._note = None
        if self._ticking is None and not self._started:
            self._started = time.monotonic()
        self._ticking = None  # the line now moves with the progress itself
        self._ticker.pause()
        text = Text(f"{label}: {stage} {done}/{total}  ")
        fraction = done / max(total, 1)
        text.append(progress_bar(fraction), style="bold")
        text.append(f" {fraction:4.0%}")
        if 0 < done < total:
            spent = time.monotonic() - self._started
            text.append(f"  ETA {clock(spent * (total - done) / done)}", style="dim")
        text.append(CANCEL_HINT)
        set_text(self.query_one(Label), text)

    def idle(self, text: str = "ready") -> None:
        self._note = None
        self._ticking, self._started = None, 0.0
        self._ticker.pause()
        set_text(self.query_one(Label), text)

    def note(self, text: str | None) -> None:
        """Say `text` when nothing else is being said; None takes the note back (if still shown)."""
        label = self.query_one(Label)
        if text is not None and (self._note is not None or str(label.content) == "ready"):
            self.idle(text)
            self._note = text
        elif text is None and self._note is not None:
            self.idle()
