"""A one-line question (open a model by path)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Label

from ..guard import guarded
from .dialog import Dialog


@guarded
class PromptScreen(Dialog):
    """Dismisses with the entered text, or None (escape)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="prompt.cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 72; max-width: 100%; height: auto; border: thick $accent; background: $surface;
                              padding: 1 2; }
    """

    def __init__(self, question: str, value: str = "", placeholder: str = ""):
        super().__init__()
        self.question, self.value, self.placeholder = question, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(self.value, placeholder=self.placeholder)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
