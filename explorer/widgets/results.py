"""Result tables: gradients per x after a run (NaN/Inf marked, with where it comes from), and the
check: its verdict per x, then every finding and per-node result, worst first (explorer/verdicts.py).
Enter on a row goes to its tensor or node."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static, TabbedContent, TabPane

from ..guard import guarded
from ..summaries import summarize
from ..verdicts import VerifyRow, mode_text, verify_rows
from .diff_table import DiffTab
from .sizing import FixedBoxTable
from .text import set_text

STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow", "cancelled": "bold yellow",
                "NaN/Inf": "bold red", "note": "bold"}


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
    Results #gradient-note { height: auto; max-height: 3; padding: 0 1; }
    /* An inconclusive x's reason and what would settle it take up to four lines: the table keeps
       its header and a row on the smallest terminals, the detail is cut there instead. */
    Results #verify-table { min-height: 2; }
    Results #verify-detail { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    Results #gradient-note { display: none; }
    Results #gradient-note.-shown { display: block; }
    """

    @dataclass
    class Jump(Message):
        """Enter on a row: go to tensor `tensor` and, for a check row, its worst element; for a finding
        or node row, to node `node` (its `tensor` shown)."""

        tensor: str | None
        index: tuple[int, ...] | None
        node: str | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(id="results-tabs"):
            with TabPane("Gradients", id="tab-gradients"):
                yield Static("", id="gradient-note")
                yield FixedBoxTable(id="gradient-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Verify", id="tab-verify"):
                yield Static("No check yet: press v.", id="verify-summary")
                yield FixedBoxTable(id="verify-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="verify-detail")
            with TabPane("Diff", id="tab-diff"):  # diff mode only (Diffing shows it)
                yield DiffTab(id="diff-tab")

    def on_mount(self) -> None:
        self.query_one("#gradient-table", DataTable).add_columns(
            "x", "shape", "norm", "max|g|", "mean", "NaN/Inf", "disconnected")
        self.query_one("#verify-table", DataTable).add_columns(
            "x / finding / node", "status", "resolved by", "max abs err", "max rel err", "worst", "analytic", "numeric")
        self._rows: dict[str, VerifyRow] = {}
        self.show_gradient(None)
        self.query_one(TabbedContent).hide_tab("tab-diff")

    def show_gradient(self, result, origin=None, summary_of=None) -> None:
        """The gradients per x; a NaN/Inf count in red and, above the table, the node it comes from.
        `summary_of(x)`: the Summary of x's gradient (the session's, made by the gradient's worker)."""
        table = self.query_one("#gradient-table", DataTable)
        note = self.query_one("#gradient-note", Static)
        table.clear()
        note.set_class(origin is not None, "-shown")
        if origin is not None:
            set_text(note, Text.assemble((origin.message, "red"), ("   n: go to the node", "bold")))
        if result is None:
            return
        for name, g in result.grads.items():
            s = (summary_of(name) if summary_of is not None else summarize(g)).as_dict()
            bad = s.get("nonfinite", 0)
            table.add_row(name, "×".join(map(str, s["shape"])) or "scalar", _num(s.get("norm")),
                          _num(s.get("max_abs")), _num(s.get("mean")),
                          Text(f"{bad} ✗", style="bold red") if bad else "0",
                          Text("yes", style="yellow") if name in result.disconnected else "", key=name)

    _check_shown: tuple | None = None  # (the report on screen,): the session is redrawn after any change

    def show_check(self, report) -> None:
        if self._check_shown is not None and self._check_shown[0] is report:
            return
        self._check_shown = (report,)
        table = self.query_one("#verify-table", DataTable)
        summary = self.query_one("#verify-summary", Static)
        table.clear()
        self._rows = {}
        set_text(self.query_one("#verify-detail", Static), "")
        if report is None:
            set_text(summary, "No check yet: press v.")
            return
        verdict = str(getattr(report.verdict, "value", report.verdict))
        text = Text.assemble("verdict ", (verdict, STATUS_STYLE.get(verdict, "bold")))
        if mode := mode_text(report):
            text.append(f"  mode {mode}", style="dim")
        first = getattr(report, "first_failing_node", None)
        if first:
            text.append(f"  first failing node: {first}", style="bold red")
        rows = verify_rows(report)
        found = len(rows) - len(report.results) - len(getattr(report, "second_order", ()))
        text.append(f"   {found} findings and node results below, worst first; " if found else "   ", style="dim")
        text.append("enter: go there", style="dim")
        set_text(summary, text)
        for row in rows:
            self._rows[row.key] = row
            table.add_row(row.label, _status(row.status), row.resolved_by, _num(row.abs_err), _num(row.rel_err), row.where,
                          _num(row.analytic), _num(row.numeric), key=row.key)
        if rows:
            self._show_detail(rows[0])

    def show_check_note(self, text: str) -> None:
        """No verdict to show (a check running or cancelled): say so instead of leaving an old one up."""
        self._check_shown = None
        self.query_one("#verify-table", DataTable).clear()
        set_text(self.query_one("#verify-summary", Static), Text(text, style="bold yellow"))
        set_text(self.query_one("#verify-detail", Static), "")
        self._rows = {}

    def show_session(self, s) -> None:
        """Every table from the session: its gradients, its check and, in diff mode, its diff."""
        self.show_gradient(s.gradient, s.gradient_origin, s.gradient_summary)
        self.show_check(s.check)
        self.show_diff(s.diff)

    def show_diff(self, diff) -> None:
        """Diff mode's table (the session's DiffShown), its tab shown while there is one."""
        self.query_one(DiffTab).show(diff)
        tabs = self.query_one(TabbedContent)
        if diff is None:
            tabs.hide_tab("tab-diff")
        else:
            tabs.show_tab("tab-diff")

    def show_tab(self, which: str) -> None:
        """Bring "gradients", "verify" or "diff" to the front (when its results arrive)."""
        self.query_one(TabbedContent).active = f"tab-{which}"

    def focus_check(self) -> None:
        """The verify table takes the keys (up/down through the rows, enter to go there)."""
        table = self.query_one("#verify-table", DataTable)
        if table.row_count:
            table.move_cursor(row=0)
            table.focus()

    def _show_detail(self, row: VerifyRow) -> None:
        text = Text(row.detail or row.status)
        text.highlight_words(["to settle it:"], "bold")
        set_text(self.query_one("#verify-detail", Static), text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        # A highlight posted for a row the table has since cleared arrives without a key.
        key = getattr(event.row_key, "value", None)
        row = self._rows.get(str(key)) if event.data_table.id == "verify-table" else None
        if row is not None:
            self._show_detail(row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if getattr(event.row_key, "value", None) is None:
            return
        key = str(event.row_key.value)
        if event.data_table.id == "diff-table":  # "where:order:node"
            self.post_message(self.Jump(None, None, key.split(":", 2)[2]))
            return
        if event.data_table.id != "verify-table":
            self.post_message(self.Jump(key, None))
            return
        row = self._rows.get(key)
        if row is not None and (row.tensor or row.node):
            self.post_message(self.Jump(row.tensor, row.index, row.node))
