"""The bottom status line: what is running, how far it got with an ETA, and how to cancel it.

One line of text in a widget of fixed size: the progress bar is drawn into the line and the time
spent ticks twice a second, so work starting, moving and ending repaints one row and never lays
out the screen.
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
    _work: str | None = None  # the running work's label
    _progress: tuple[str, int, int] | None = None  # its stage, done, total
    _started: float = 0.0

    def compose(self) -> ComposeResult:
        yield Label("ready", id="status-text")

    def on_mount(self) -> None:
        self._ticker = self.set_interval(0.5, self._draw, pause=True)

    def busy(self, label: str) -> None:
        self._note, self._work, self._progress, self._started = None, label, None, time.monotonic()
        self._ticker.resume()
        self._draw()

    def progress(self, label: str, done: int, total: int, stage: str) -> None:
        if self._work is None:
            self.busy(label)
        self._work, self._progress = label, (stage, done, total)
        self._draw()

    def _draw(self) -> None:
        if self._work is None:
            return
        spent = time.monotonic() - self._started
        if self._progress is None:
            set_text(self.query_one(Label), f"{self._work}…  {clock(spent)}{CANCEL_HINT}")
            return
        stage, done, total = self._progress
        fraction = done / max(total, 1)
        text = Text(f"{self._work}: {stage} {done}/{total}  ")
        text.append(progress_bar(fraction), style="bold")
        text.append(f" {fraction:4.0%}  {clock(spent)}")
        if 0 < done < total:
            text.append(f"  ETA {clock(spent * (total - done) / done)}", style="dim")
        text.append(CANCEL_HINT)
        set_text(self.query_one(Label), text)

    def idle(self, text: str = "ready") -> None:
        self._note, self._work, self._progress = None, None, None
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
