"""Result tables: gradients per x after a run, and the finite-difference check per x."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static, TabbedContent, TabPane

from ..guard import guarded
from ..summaries import summarize

STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def _num(v) -> str:
    return "" if v is None else f"{v:.4g}"


def _status(v) -> Text:
    text = str(getattr(v, "value", v))
    return Text(text, style=STATUS_STYLE.get(text, "bold"))


@guarded
class Results(Vertical):
    DEFAULT_CSS = """
    Results { height: 12; border-top: solid $panel; }
    Results TabbedContent { height: 1fr; }
    Results TabPane { padding: 0; }
    Results DataTable { height: 1fr; }
    Results #verify-summary { height: auto; max-height: 2; padding: 0 1; }
    """

    @dataclass
    class Jump(Message):
        """Enter on a row: go to tensor `tensor` and, for a check row, its worst element."""

        tensor: str
        index: tuple[int, ...] | None

    def compose(self) -> ComposeResult:
        with TabbedContent(id="results-tabs"):
            with TabPane("Gradients", id="tab-gradients"):
                yield DataTable(id="gradient-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Verify", id="tab-verify"):
                yield Static("No check yet: press v.", id="verify-summary")
                yield DataTable(id="verify-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#gradient-table", DataTable).add_columns(
            "x", "shape", "norm", "max|g|", "mean", "NaN/Inf", "disconnected")
        self.query_one("#verify-table", DataTable).add_columns(
            "x", "status", "max abs err", "max rel err", "worst index", "analytic", "numeric")
        self.show_gradient(None)

    def show_gradient(self, result, summary_of=None) -> None:
        """`summary_of(x)`: the Summary of x's gradient (the session's, made by the gradient's worker)."""
        table = self.query_one("#gradient-table", DataTable)
        table.clear()
        if result is None:
            return
        for name, g in result.grads.items():
            s = (summary_of(name) if summary_of is not None else summarize(g)).as_dict()
            table.add_row(name, "×".join(map(str, s["shape"])) or "scalar", _num(s.get("norm")),
                          _num(s.get("max_abs")), _num(s.get("mean")), str(s.get("nonfinite", 0)),
                          Text("yes", style="yellow") if name in result.disconnected else "", key=name)

    def show_check(self, report) -> None:
        table = self.query_one("#verify-table", DataTable)
        summary = self.query_one("#verify-summary", Static)
        table.clear()
        if report is None:
            summary.update("No check yet: press v.")
            return
        verdict = str(getattr(report.verdict, "value", report.verdict))
        text = Text.assemble("verdict ", (verdict, STATUS_STYLE.get(verdict, "bold")))
        mode = getattr(report, "mode", None)
        if mode:
            text.append(f"  mode {mode}", style="dim")
        first = getattr(report, "first_failing_node", None)
        if first:
            name = getattr(first, "node_name", first)
            op = getattr(first, "op_type", "")
            text.append(f"  first failing node: {name} {f'({op})' if op else ''}", style="bold red")
        doubtful = next((r for r in report.results if str(r.status) != "pass" and getattr(r, "reason", "")), None)
        if doubtful is not None:
            text.append(f"\n{doubtful.name}: {doubtful.reason}", style="yellow")
        else:
            text.append("   enter: go to the worst element", style="dim")
        summary.update(text)
        for r in report.results:
            worst = getattr(r, "worst_index", None)
            table.add_row(r.name, _status(r.status), _num(getattr(r, "max_abs_err", None)),
                          _num(getattr(r, "max_rel_err", None)), "" if worst is None else str(tuple(worst)),
                          _num(getattr(r, "analytic", None)), _num(getattr(r, "numeric", None)), key=r.name)
        self._worst = {r.name: getattr(r, "worst_index", None) for r in report.results}

    def show_check_note(self, text: str) -> None:
        """No verdict to show (a check running or cancelled): say so instead of leaving an old one up."""
        self.query_one("#verify-table", DataTable).clear()
        self.query_one("#verify-summary", Static).update(Text(text, style="bold yellow"))
        self._worst = {}

    def show_tab(self, which: str) -> None:
        """Bring "gradients" or "verify" to the front (when its results arrive)."""
        self.query_one(TabbedContent).active = f"tab-{which}"

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        name = str(event.row_key.value)
        index = None
        if event.data_table.id == "verify-table":
            worst = getattr(self, "_worst", {}).get(name)
            index = None if worst is None else tuple(int(i) for i in worst)
        self.post_message(self.Jump(name, index))
