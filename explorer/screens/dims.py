"""The dims dialog: one size per symbolic dim of the model (batch, seq), for every value the app
makes up for an input nobody fed. Errors stay in the dialog."""
from __future__ import annotations

from typing import Callable, Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from ..guard import guarded
from .dialog import Dialog


@guarded
class DimsScreen(Dialog):
    """Dismisses with the dims applied ({name: size}), or None (cancelled)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dims.cancel")]
    DEFAULT_CSS = """
    DimsScreen { align: center middle; }
    DimsScreen > Vertical { width: 72; max-width: 100%; height: auto; max-height: 100%;
                            border: thick $accent; background: $surface; padding: 0 1; }
    DimsScreen Horizontal { height: auto; }
    DimsScreen .dims-name { width: 12; padding: 1 1 0 0; text-style: bold; }
    DimsScreen .dims-where { width: 1fr; padding: 1 0 0 1; color: $text-muted; }
    DimsScreen Input { width: 12; }
    DimsScreen #dims-error { color: $error; text-style: bold; }
    DimsScreen .dims-caption { color: $text-muted; }
    DimsScreen Button { margin-right: 2; margin-top: 1; }
    """

    def __init__(self, dims: Mapping[str, list[tuple[str, int]]], current: Mapping[str, int],
                 try_dims: Callable[[dict[str, int]], str | None]):
        super().__init__()
        self.dims = dict(dims)  # name -> the (input, axis) pairs carrying it
        self.current = dict(current)
        self.try_dims = try_dims  # applies them to the session: the problem, or None when applied

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Symbolic dims[/b]: sizes for the values made up for unfed inputs")
            for k, (name, where) in enumerate(self.dims.items()):
                with Horizontal():
                    yield Label(name, classes="dims-name")
                    yield Input(str(self.current.get(name, 1)), id=f"dims-{k}", type="integer")
                    carriers = ", ".join(f"{t}[{axis}]" for t, axis in where[:3]) + (", …" if len(where) > 3 else "")
                    yield Label(carriers, classes="dims-where")
            yield Label("", id="dims-error")
            with Horizontal():
                yield Button("Apply", variant="primary", id="dims-apply")
                yield Button("Cancel", id="dims-cancel")
            yield Static("tab / shift+tab: next / previous field; enter applies; esc cancels. "
                         "CLI: --dim NAME=N; Python: dims={...}.", classes="dims-caption")

    def on_mount(self) -> None:
        if self.dims:
            self.query_one("#dims-0", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "dims-apply":
            self._apply()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _apply(self) -> None:
        error = self.query_one("#dims-error", Label)
        dims = {}
        for k, name in enumerate(self.dims):
            text = self.query_one(f"#dims-{k}", Input).value.strip()
            if not text.isdigit() or int(text) < 1:
                error.update(f"{name}: give a positive integer, not {text!r}")
                return
            if name in self.current or int(text) != 1:  # an untouched 1 stays unset: a fed file may size it
                dims[name] = int(text)
        problem = self.try_dims(dims)
        if problem:
            error.update(problem)
            return
        self.dismiss(dims)
