"""The results' Diff tab (diff mode): one row per compared node in the direction shown, worst first
(local error over tolerance), with its verdict; enter goes to the node."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from .sizing import FixedBoxTable
from .text import set_text

VERDICT = {"fail": Text("✗ diverges", style="bold red"), "inconclusive": Text("≈ carries", style="yellow"),
           "pass": Text("✓ agrees", style="green")}


class DiffTab(Vertical):
    DEFAULT_CSS = """
    DiffTab { height: 1fr; }
    DiffTab #diff-summary { height: auto; max-height: 2; padding: 0 1; }
    DiffTab DataTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("No diff: press b.", id="diff-summary")
        yield FixedBoxTable(id="diff-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("node", "op", "verdict", "local error", "tolerance", "error", "note")
        self._shown: tuple | None = None

    def show(self, diff) -> None:
        """`diff`: the session's DiffShown (None: no diff); redrawn when it or its direction changed."""
        key = None if diff is None else (diff.report, diff.where)
        if key == self._shown:
            return
        self._shown = key
        table = self.query_one(DataTable)
        table.clear()
        if diff is None:
            set_text(self.query_one("#diff-summary", Static), "No diff: press b.")
            return
        # worst first: by local error over tolerance, then by the error carried from upstream
        rows = sorted((r for r in diff.report.nodes if r.where == diff.where),
                      key=lambda r: (-_ratio(r.local_error, r.tolerance), -_ratio(r.error, r.tolerance), r.order))
        summary = Text.assemble((f"{diff.where} ", "bold"), diff.headline(), style="")
        summary.append(f"   {len(rows)} nodes, worst first; enter: go there; B: forward/gradient", style="dim")
        set_text(self.query_one("#diff-summary", Static), summary)
        for r in rows:
            mark = "fail" if r.diverges else "inconclusive" if r.error > r.tolerance else "pass"
            table.add_row(r.node, r.op_type, VERDICT[mark], f"{r.local_error:.3g}", f"{r.tolerance:.2g}",
                          f"{r.error:.3g}", r.note, key=f"{r.where}:{r.order}:{r.node}")


def _ratio(error: float, tolerance: float) -> float:
    return error / tolerance if tolerance > 0 else float("inf") if error > 0 else 0.0
