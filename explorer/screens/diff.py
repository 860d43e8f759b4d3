"""The diff dialog: what to compare this model (A) with — another model file, itself run in float16 or
bfloat16, or onnxruntime on its file — and, in diff mode, the way back to the normal view."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from ..diff_state import AGAINST, HALF_TYPES, DiffChoice
from ..guard import guarded
from .dialog import Dialog

LEAVE, AGAIN = "leave", "again"


@guarded
class DiffScreen(Dialog):
    """Dismisses with a DiffChoice, LEAVE (back to the normal view), AGAIN (the diff shown, computed anew),
    or None (cancelled)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="diff.cancel")]
    DEFAULT_CSS = """
    DiffScreen { align: center middle; }
    DiffScreen > Vertical { width: 76; max-width: 100%; height: auto; max-height: 100%; overflow-y: auto;
                            border: thick $accent; background: $surface; padding: 0 1; }
    DiffScreen Horizontal { height: auto; }
    DiffScreen Label { margin-top: 1; width: 1fr; }
    DiffScreen #diff-title { margin-top: 0; }
    DiffScreen .diff-beside { width: 1fr; padding: 2 0 0 1; }
    DiffScreen #diff-error { color: $error; text-style: bold; margin-top: 0; }
    DiffScreen .diff-caption { color: $text-muted; }
    DiffScreen Button { margin-right: 1; margin-top: 1; min-width: 10; }
    """

    def __init__(self, compares: str, shown: str | None = None, last_b: str = "", stale: bool = False):
        super().__init__()
        self.compares = compares  # what the diff will compare: the selection, or the forward alone
        self.shown = shown  # the diff on screen ("vs B.onnx"), when in diff mode
        self.last_b = last_b
        self.stale = stale  # the diff shown was computed before the session changed: offer it again first

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Diff[/b]: run this model (A) and B on the same feeds, node by node", id="diff-title")
            yield Static(self.compares, classes="diff-caption")
            if self.shown:  # b in diff mode, then enter: back to the normal view
                with Horizontal():
                    if self.stale:
                        yield Button("Compare again", variant="primary", id="diff-again")
                    yield Button("Leave diff mode", variant="warning", id="diff-leave")
                    yield Static(f"now showing the diff {self.shown}{' (stale)' if self.stale else ''}",
                                 classes="diff-caption diff-beside")
            yield Label("B, another model file (a changed, optimized or quantized copy):")
            yield Input(self.last_b, placeholder="path/to/B.onnx", id="diff-path")
            yield Label("", id="diff-error")
            with Horizontal():
                yield Button("Compare with file", variant="primary", id="diff-file")
                yield Button("Cancel", id="diff-cancel")
            yield Label("Or A against itself in a half type, or the engine against onnxruntime on A's file:")
            with Horizontal():
                for dtype in HALF_TYPES:
                    yield Button(dtype, id=f"diff-{dtype}")
                yield Button(AGAINST, id=f"diff-{AGAINST}")
            yield Static("enter compares with the file; tab moves between buttons; esc cancels. "
                         "CLI: onnxgrad diff A.onnx B.onnx, --dtype float16, --against onnxruntime.",
                         classes="diff-caption")

    def on_mount(self) -> None:
        self.query_one("#diff-again" if self.stale else "#diff-leave" if self.shown else "#diff-path").focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._compare_file()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        which = (event.button.id or "").removeprefix("diff-")
        if which == "file":
            self._compare_file()
        elif which in HALF_TYPES:
            self.dismiss(DiffChoice(dtype=which))
        elif which == AGAINST:
            self.dismiss(DiffChoice(against=AGAINST))
        elif which in (LEAVE, AGAIN):
            self.dismiss(which)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _compare_file(self) -> None:
        path = self.query_one("#diff-path", Input).value.strip()
        if not path:
            self.query_one("#diff-error", Label).update("give B's path, or choose a half type or onnxruntime below")
            return
        self.dismiss(DiffChoice(b=path))
