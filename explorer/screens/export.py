"""Export dialog: gradients (.npz), the report (JSON), the graph (DOT, SVG or PNG) to a path.

The file name's extension decides the format: the kind buttons follow what is typed, a button
pressed rewrites the extension, and a name no format matches is refused inside the dialog.
"""
from __future__ import annotations

import os

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, RadioButton, RadioSet, Static

from ..guard import guarded
from .dialog import Dialog

EXPORTS = {  # what -> (button label, default name ending, extensions written as that kind)
    "gradients": ("gradients", "_grads.npz", (".npz",)),
    "report": ("report", "_report.json", (".json",)),
    "dot": ("DOT graph", ".dot", (".dot", ".gv")),
    "svg": ("SVG/PNG graph", ".svg", (".svg", ".png")),
}
KNOWN = ", ".join(f"{'/'.join(exts)} ({label})" for label, _, exts in EXPORTS.values())


def kind_of(path: str) -> str | None:
    """What a file name's extension says it holds, or None for an extension no export writes."""
    ext = os.path.splitext(path.strip())[1].lower()
    return next((what for what, (_, _, exts) in EXPORTS.items() if ext in exts), None)


def mismatch(what: str, path: str) -> str | None:
    """Why `path` cannot hold `what`, in one line, or None when it can."""
    kind = kind_of(path)
    if kind == what:
        return None
    name = os.path.basename(path.strip()) or "the file name"
    if kind is None:
        return f"{name}: the extension picks the format; use {KNOWN}"
    return f"{name} names a {EXPORTS[kind][0]} file; a {EXPORTS[what][0]} file ends in {'/'.join(EXPORTS[what][2])}"


@guarded
class ExportScreen(Dialog):
    """Dismisses with (what, path), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="export.cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 72; max-width: 100%; height: auto; max-height: 100%;
                              border: thick $accent; background: $surface; padding: 0 1; }
    ExportScreen RadioSet { layout: horizontal; width: 100%; }
    ExportScreen RadioSet > RadioButton { width: auto; }
    ExportScreen Horizontal { height: auto; margin-top: 1; }
    ExportScreen Button { margin-right: 2; }
    ExportScreen #export-error { color: $error; text-style: bold; }
    ExportScreen .export-caption { color: $text-muted; }
    """

    def __init__(self, stem: str, what: str = "gradients"):
        super().__init__()
        self.stem = stem
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Export[/b]  (paths are relative to the folder onnxgrad was started in)")
            with RadioSet(id="export-what"):
                for key, (label, _, _) in EXPORTS.items():
                    yield RadioButton(label, value=key == self.what, id=f"export-{key}")
            yield Input(self.stem + EXPORTS[self.what][1], id="export-path")
            yield Label("", id="export-error")
            with Horizontal():
                yield Button("Export", variant="primary", id="export-go")
                yield Button("Cancel", id="export-cancel")
            yield Static("The extension picks the format. tab / shift+tab: next / previous field; "
                         "←/→: kind; enter exports; esc cancels.", classes="export-caption")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        self.what = str(event.pressed.id).removeprefix("export-")
        box = self.query_one(Input)
        if kind_of(box.value) != self.what:  # a kind chosen: its extension replaces the typed one
            root = os.path.splitext(box.value.strip())[0] or self.stem
            for tail in ("_grads", "_report"):  # the default names' tails go with their extensions
                root = root.removesuffix(tail)
            box.value = root + EXPORTS[self.what][1]

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_one("#export-error", Label).update("")
        kind = kind_of(event.value)
        if kind is not None and kind != self.what:  # a typed extension: the kind follows it
            self.query_one(f"#export-{kind}", RadioButton).value = True

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
        problem = mismatch(self.what, path) if path else "type a file name"
        if problem:
            self.query_one("#export-error", Label).update(problem)
            return
        self.dismiss((self.what, path))
