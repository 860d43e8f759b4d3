"""Export dialog: gradients (.npz), the report (JSON), the graph (DOT or SVG) to a path."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet

from ..guard import guarded

EXPORTS = {  # what -> (button label, file suffix)
    "gradients": ("gradients .npz", "_grads.npz"),
    "report": ("report .json", "_report.json"),
    "dot": ("graph .dot", ".dot"),
    "svg": ("graph .svg", ".svg"),
}


@guarded
class ExportScreen(ModalScreen):
    """Dismisses with (what, path), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="export.cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 72; height: auto; border: thick $accent; background: $surface; padding: 1 2; }
    ExportScreen RadioSet { layout: horizontal; width: 100%; }
    ExportScreen Horizontal { height: auto; margin-top: 1; }
    ExportScreen Button { margin-right: 2; }
    """

    def __init__(self, stem: str, what: str = "gradients"):
        super().__init__()
        self.stem = stem
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Export[/b]  (paths are relative to the folder onnxgrad was started in)")
            with RadioSet(id="export-what"):
                for key, (label, _) in EXPORTS.items():
                    yield RadioButton(label, value=key == self.what, id=f"export-{key}")
            yield Input(self.stem + EXPORTS[self.what][1], id="export-path")
            with Horizontal():
                yield Button("Export", variant="primary", id="export-go")
                yield Button("Cancel", id="export-cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        self.what = str(event.pressed.id).removeprefix("export-")
        self.query_one(Input).value = self.stem + EXPORTS[self.what][1]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._go()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-go":
            self._go()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _go(self) -> None:
        path = self.query_one(Input).value.strip()
        if path:
            self.dismiss((self.what, path))
