"""Help: every key, generated from the bindings themselves, and the workflow in a few lines."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..guard import guarded
from .dialog import Dialog

WORKFLOW = "\n".join([  # one line per step: the dialog wraps them to its width
    "1. Move to a tensor (arrows in the graph, or / to search the list; o cycles a node's tensors).",
    "2. y marks it as the tensor to differentiate; x / z add tensors to xs / zs. An invalid selection "
    "is explained in the bar at the top, in the engine's own words.",
    "3. f feeds the current tensor: random(seed), zeros, ones, a constant, a .npy file or an expression "
    "over other tensors. Feeding an intermediate (put it in xs or zs) works the same.",
    "4. r computes the gradients (table below); v checks them against finite differences; s steps "
    "through forward and reverse mode node by node; e exports; g switches the view.",
    "Long work runs in the background: esc cancels it. tab / shift+tab move between the panes and "
    "between a dialog's fields. ctrl+p lists every action.",
])


def binding_table(groups: list[tuple[str, list[Binding]]]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    table.add_column(style="dim")
    for title, bindings in groups:
        table.add_row(Text(title, style="bold underline"), "", "")
        for b in bindings:
            table.add_row(b.key_display or b.key, b.tooltip or b.description, b.id or "")
    return table


@guarded
class HelpScreen(Dialog):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help.close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; max-width: 100%; height: 34; max-height: 100%;
                                  border: thick $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, groups: list[tuple[str, list[Binding]]]):
        super().__init__()
        self.groups = groups

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("onnxgrad explorer", style="bold"))
            yield Static(WORKFLOW)
            yield Static(binding_table(self.groups))
