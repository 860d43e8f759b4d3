"""Rich renderings of arrays: a stats line, a small histogram, a heatmap of a 2-D slice."""
from __future__ import annotations

import numpy as np
from rich.color import Color
from rich.style import Style
from rich.text import Text

from ..summaries import BINS, Summary, summarize

BARS = " ▁▂▃▄▅▆▇█"
HEAT_ROWS, HEAT_COLS = 16, 16


def _summary(a) -> Summary:
    return a if isinstance(a, Summary) else summarize(a)


def stats_text(a, label: str = "") -> Text:
    """`a`: an array, or its Summary (which is what the inspector passes: made once, by a worker if big)."""
    s = _summary(a).as_dict()
    t = Text()
    if label:
        t.append(f"{label} ", style="bold")
    t.append(f"{tuple(s['shape'])} {s['dtype']}")
    if "norm" in s:
        t.append(f"\n  norm {s['norm']:.4g}  mean {s['mean']:.4g}\n  min {s['min']:.4g}  max {s['max']:.4g}")
    if s.get("nonfinite"):
        t.append(f"\n  {s['nonfinite']} NaN/Inf", style="bold red")
    return t


def histogram(a) -> Text:
    """One row of bars over the finite values, with the range underneath (`a`: an array or its Summary)."""
    s = _summary(a)
    if not s.finite:
        return Text("(no finite values)", style="dim")
    lo, hi = s.min, s.max
    if not s.counts:
        return Text(f"all {s.finite} values = {lo:.4g}", style="dim")
    top = max(s.counts)
    bars = "".join(BARS[int(np.ceil(c / top * (len(BARS) - 1)))] for c in s.counts)
    t = Text(bars, style="cyan")
    gap = max(1, BINS - len(f"{lo:.3g}") - len(f"{hi:.3g}"))
    t.append(f"\n{lo:.3g}{' ' * gap}{hi:.3g}", style="dim")
    return t


def parse_slice(text: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """Leading indices for a 2-D slice from "0,1" or "0,1,:,:"; returns (indices, canonical text)."""
    lead = max(0, len(shape) - 2)
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip() and p.strip() != ":"]
    idx = []
    for k in range(lead):
        try:
            v = int(parts[k]) if k < len(parts) else 0
        except ValueError:
            raise ValueError(f"slice index {parts[k]!r} is not an integer") from None
        if not -shape[k] <= v < shape[k]:
            raise ValueError(f"index {v} is out of range for axis {k} of size {shape[k]}")
        idx.append(v % shape[k])
    canon = ",".join([str(i) for i in idx] + [":"] * min(2, len(shape)))
    return tuple(idx), canon


def heatmap(a, lead: tuple[int, ...] = (), focus: tuple[int, int] | None = None) -> Text:
    """A diverging heatmap (blue < 0 < red) of a[lead], windowed around `focus` when large."""
    a = np.asarray(a)
    if a.dtype.kind not in "fiub":
        return Text(f"(no heatmap for {a.dtype})", style="dim")
    plane = np.atleast_2d(a[lead] if lead else a)
    if plane.ndim > 2:
        plane = plane.reshape(plane.shape[0], -1)
    rows, cols = plane.shape
    r0 = _window(rows, HEAT_ROWS, focus[0] if focus else 0)
    c0 = _window(cols, HEAT_COLS, focus[1] if focus else 0)
    # Only the window is converted: the slice itself may be a 50,257×768 embedding.
    view = np.asarray(plane[r0:r0 + HEAT_ROWS, c0:c0 + HEAT_COLS], dtype=np.float64)
    finite = view[np.isfinite(view)]
    scale = float(np.abs(finite).max()) if finite.size else 0.0
    t = Text()
    for i, row in enumerate(view):
        for j, v in enumerate(row):
            mark = "◆ " if focus is not None and (r0 + i, c0 + j) == tuple(focus) else "  "
            t.append(mark, style=Style(bgcolor=_color(v, scale), color="black"))
        t.append("\n")
    t.append(f"rows {r0}–{r0 + view.shape[0] - 1} of {rows}, cols {c0}–{c0 + view.shape[1] - 1} of {cols};"
              f" ±{scale:.3g}", style="dim")
    return t


def _window(size: int, span: int, focus: int) -> int:
    if size <= span:
        return 0
    return int(min(max(0, focus - span // 2), size - span))


def _color(v: float, scale: float) -> Color:
    if not np.isfinite(v):
        return Color.from_rgb(255, 0, 255)
    if scale == 0:
        return Color.from_rgb(235, 235, 235)
    f = max(-1.0, min(1.0, v / scale))
    if f >= 0:
        return Color.from_rgb(235, int(235 - 190 * f), int(235 - 190 * f))
    return Color.from_rgb(int(235 + 190 * f), int(235 + 190 * f), 235)
