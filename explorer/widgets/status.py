"""The bottom status line: what is running, its progress bar with ETA, and how to cancel it."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from .text import set_text


class StatusLine(Horizontal):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel-darken-1; }
    StatusLine > Label { width: 1fr; height: 1; }
    StatusLine > ProgressBar { display: none; width: 50; }
    StatusLine.-busy > ProgressBar { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield Label("ready", id="status-text")
        yield ProgressBar(total=None, show_eta=True, id="status-progress")

    def busy(self, label: str) -> None:
        self.add_class("-busy")
        self._note = None
        bar = self.query_one(ProgressBar)
        bar.update(total=None, progress=0)
        set_text(self.query_one(Label), f"{label}…  (esc cancels)")

    def progress(self, label: str, done: int, total: int, stage: str) -> None:
        self.add_class("-busy")
        self._note = None
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        set_text(self.query_one(Label), f"{label}: {stage} {done}/{total}  (esc cancels)")

    _note: str | None = None

    def idle(self, text: str = "ready") -> None:
        self.remove_class("-busy")
        self._note = None
        set_text(self.query_one(Label), text)

    def note(self, text: str | None) -> None:
        """Say `text` when nothing else is being said; None takes the note back (if still shown)."""
        label = self.query_one(Label)
        if text is not None and (self._note is not None or str(label.content) == "ready"):
            self.idle(text)
            self._note = text
        elif text is None and self._note is not None:
            self.idle()
