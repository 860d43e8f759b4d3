"""The feed dialog: choose where one tensor's value comes from; errors stay in the dialog."""
from __future__ import annotations

from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, RadioButton, RadioSet

from engine.errors import OnnxGradError

from ..feeding import EXPRESSION_HELP, FEED_KINDS, FeedSource, source_from
from ..guard import guarded
from .dialog import Dialog

HINTS = {
    "random": "seed: standard normals for floats; integers uniform over [0, table size)",
    "zeros": "no parameter",
    "ones": "no parameter",
    "constant": "the value, e.g. 0.5",
    "npy": "path to a .npy file of the tensor's shape",
    "expression": EXPRESSION_HELP,
}
CLEAR = "clear"


@guarded
class FeedScreen(Dialog):
    """Dismisses with a FeedSource, CLEAR, or None (cancelled)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="feed.cancel")]
    DEFAULT_CSS = """
    FeedScreen { align: center middle; }
    FeedScreen > Vertical { width: 84; max-width: 100%; height: auto; max-height: 100%;
                            border: thick $accent; background: $surface; padding: 0 1; }
    FeedScreen RadioSet { width: 100%; }
    FeedScreen #feed-hint, FeedScreen #feed-spec-hint { color: $text-muted; }
    FeedScreen #feed-error { color: $error; text-style: bold; }
    FeedScreen Horizontal { height: auto; margin-top: 1; }
    FeedScreen Button { margin-right: 2; }
    """

    def __init__(self, tensor: str, current: FeedSource | None, explicit: bool,
                 try_feed: Callable[[FeedSource], str | None], unfed: str = "computed by the model"):
        super().__init__()
        self.tensor = tensor
        self.now = current.describe() + ("" if explicit else ", default") if current else unfed
        self.current = current or FeedSource("random")
        self.explicit = explicit
        self.try_feed = try_feed  # tries the feed on the session: the problem, or None when applied

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Feed [b]{self.tensor}[/b]  (now: {self.now})")
            with RadioSet(id="feed-kind"):
                for kind in FEED_KINDS:
                    yield RadioButton(kind, value=kind == self.current.kind, id=f"kind-{kind}")
            yield Input(value=self.current.parameter, id="feed-parameter")
            yield Label(HINTS[self.current.kind], id="feed-hint")
            yield Label("or type a whole spec: zeros, ones, random:3, 0.5, file.npy, =2*X + 1", id="feed-spec-hint")
            yield Label("", id="feed-error")
            with Horizontal():
                yield Button("Apply", variant="primary", id="feed-apply")
                yield Button("Clear feed", id="feed-clear", disabled=not self.explicit)
                yield Button("Cancel", id="feed-cancel")

    def on_mount(self) -> None:
        self.query_one("#feed-parameter", Input).focus()

    @property
    def kind(self) -> str:
        pressed = self.query_one(RadioSet).pressed_button
        return str(pressed.label) if pressed is not None else "random"

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        kind = str(event.pressed.label)
        self.query_one("#feed-hint", Label).update(HINTS[kind])
        box = self.query_one("#feed-parameter", Input)
        box.disabled = kind in ("zeros", "ones")
        box.value = {"random": "0", "constant": "1"}.get(kind, "")
        self.query_one("#feed-error", Label).update("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "feed-apply":
            self._apply()
        elif event.button.id == "feed-clear":
            self.dismiss(CLEAR)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _apply(self) -> None:
        error = self.query_one("#feed-error", Label)
        try:
            source = source_from(self.kind, self.query_one("#feed-parameter", Input).value)
        except OnnxGradError as exc:
            error.update(str(exc))
            return
        problem = self.try_feed(source)
        if problem:
            error.update(problem)
            return
        self.dismiss(source)
