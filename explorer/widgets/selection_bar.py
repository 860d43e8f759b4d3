"""The current selection, settings and any problem with the selection, always on screen."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from .text import set_text


class SelectionBar(Static):
    DEFAULT_CSS = """
    SelectionBar { height: auto; min-height: 2; max-height: 4; padding: 0 1; background: $panel; }
    """

    def show(self, session, busy: str = "") -> None:
        s = session
        t = Text()
        t.append(f"{s.label}  ", style="bold")
        t.append("y ", style="dim")
        t.append(s.y or "—", style="bold magenta" if s.y else "dim")
        t.append("   xs ", style="dim")
        t.append(", ".join(s.xs) or "—", style="bold green" if s.xs else "dim")
        t.append("   zs ", style="dim")
        t.append(", ".join(s.zs) or "—", style="bold blue" if s.zs else "dim")
        fed = len(s.feeds)
        t.append(f"   │ {s.device} {s.dtype}")
        if dims := s.dims_text():
            t.append(f" │ dims {dims}", style="bold" if s.dims else "")
        t.append(f" │ view {s.view} │ {fed} feed{'s' if fed != 1 else ''} set")
        if busy:
            t.append(f" │ {busy}", style="yellow")
        t.append("\n")
        if s.selection_error:
            t.append("✗ " + s.selection_error, style="bold red")
            if s.missing_inputs:
                t.append("   i puts them in zs", style="bold")
        elif s.spec is not None:
            n = len(s.slice_nodes())
            t.append(f"✓ valid: {n} node{'s' if n != 1 else ''} from xs to y", style="green")
            if s.spec.disconnected:
                t.append(f"; y does not depend on {', '.join(sorted(s.spec.disconnected))}", style="yellow")
            t.append("   r run · v verify · s step", style="dim")
            for d in s.spec.determined:
                t.append("\n" + d.note, style="yellow")
        else:
            t.append("Pick a tensor and press y to differentiate it, x / z to add inputs to xs / zs.", style="dim")
        if s.diff is not None:
            t.append(f"\ndiff {s.diff.label}", style="bold reverse")
            t.append(f"  {s.diff.where} · {s.diff.headline()}", style="bold red" if s.diff.report.diverges else "green")
            hints = (["n culprit"] if s.diff.report.diverges else []) + ["B forward/gradient", "b leave"]
            t.append("   " + " · ".join(hints), style="dim")
            if s.diff.stale(s):
                t.append("\n  stale: the feeds, dims, device or selection changed since (b, enter compares again)",
                         style="bold yellow")
        set_text(self, t)
