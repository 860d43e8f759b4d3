"""Draw a region of a GraphLayout as text with box-drawing characters (no UI library needed).

`Canvas(layout).region(x, y, width, height)` returns one tuple of Segments per row; each
segment is a run of text with one tag: a node's role ("x", "active", "backward", ...), an
edge tag "edge:<kind>" (data, output, cut, grad, partial), or None for
blank cells. Only what falls in the region is drawn, so a viewport over a 2,000-node graph
costs what the viewport shows.
"""
from __future__ import annotations

from dataclasses import dataclass

from .layout import GraphLayout, LayoutNode

UP, DOWN, LEFT, RIGHT = 1, 2, 4, 8
JOINTS = {
    UP: "│", DOWN: "│", UP | DOWN: "│", LEFT: "─", RIGHT: "─", LEFT | RIGHT: "─",
    DOWN | RIGHT: "┌", DOWN | LEFT: "┐", UP | RIGHT: "└", UP | LEFT: "┘",
    UP | DOWN | RIGHT: "├", UP | DOWN | LEFT: "┤", DOWN | LEFT | RIGHT: "┬", UP | LEFT | RIGHT: "┴",
    UP | DOWN | LEFT | RIGHT: "┼",
}
ARROW = "▼"
BAND = 32  # rows per bucket of the spatial index


@dataclass(frozen=True)
class Segment:
    text: str
    tag: str | None


def fit_label(label: str, room: int) -> str:
    if room <= 0:
        return ""
    if len(label) <= room:
        return label
    return label[: room - 1] + "…" if room > 1 else "…"


class Canvas:
    """A layout indexed by row bands, ready to draw any viewport quickly."""

    def __init__(self, layout: GraphLayout):
        self.layout = layout
        self._nodes: dict[int, list[LayoutNode]] = {}
        self._runs: dict[int, list[tuple[int, int, int, int, str, bool, bool]]] = {}
        for n in layout.nodes:
            for band in range(n.y // BAND, (n.y + n.height - 1) // BAND + 1):
                self._nodes.setdefault(band, []).append(n)
        for e in layout.edges:
            tag = f"edge:{e.kind}"
            last = len(e.points) - 2
            for k, ((x0, y0), (x1, y1)) in enumerate(zip(e.points, e.points[1:])):
                run = (x0, y0, x1, y1, tag, k == 0, k == last)
                for band in range(min(y0, y1) // BAND, max(y0, y1) // BAND + 1):
                    self._runs.setdefault(band, []).append(run)

    def region(self, x: int, y: int, width: int, height: int) -> list[tuple[Segment, ...]]:
        chars = [[" "] * width for _ in range(height)]
        tags: list[list[str | None]] = [[None] * width for _ in range(height)]
        masks: dict[tuple[int, int], int] = {}
        arrows: set[tuple[int, int]] = set()
        bands = range(max(y, 0) // BAND, max(y + height - 1, 0) // BAND + 1)
        seen_runs, seen_nodes = set(), set()
        x_end, y_end = x + width, y + height
        for band in bands:
            for run in self._runs.get(band, ()):
                if id(run) in seen_runs:
                    continue
                seen_runs.add(id(run))
                self._draw_run(run, x, y, x_end, y_end, masks, tags, arrows)
        for (cx, cy), mask in masks.items():
            chars[cy - y][cx - x] = JOINTS.get(mask, "┼")
        for cx, cy in arrows:
            chars[cy - y][cx - x] = ARROW
        for band in bands:
            for n in self._nodes.get(band, ()):
                if id(n) in seen_nodes:
                    continue
                seen_nodes.add(id(n))
                if n.x < x_end and n.x + n.width > x and n.y < y_end and n.y + n.height > y:
                    self._draw_box(n, x, y, x_end, y_end, chars, tags, masks)
        return [_segments(chars[r], tags[r]) for r in range(height)]

    def lines(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> list[str]:
        width = self.layout.width if width is None else width
        height = self.layout.height if height is None else height
        return ["".join(s.text for s in row) for row in self.region(x, y, width, height)]

    @staticmethod
    def _draw_run(run, x, y, x_end, y_end, masks, tags, arrows) -> None:
        x0, y0, x1, y1, tag, first, last = run
        if x0 == x1:
            lo, hi = sorted((y0, y1))
            cells = [(x0, cy, (UP if cy > lo else 0) | (DOWN if cy < hi else 0)) for cy in range(max(lo, y), min(hi, y_end - 1) + 1)]
        else:
            lo, hi = sorted((x0, x1))
            cells = [(cx, y0, (LEFT if cx > lo else 0) | (RIGHT if cx < hi else 0)) for cx in range(max(lo, x), min(hi, x_end - 1) + 1)]
        for cx, cy, mask in cells:
            if x <= cx < x_end and y <= cy < y_end:
                masks[(cx, cy)] = masks.get((cx, cy), 0) | mask
                tags[cy - y][cx - x] = tag
        if last and x0 == x1 and y1 > y0:  # the cell above the target's top border
            ax, ay = x1, y1 - 1
            if ay > y0 and x <= ax < x_end and y <= ay < y_end:
                arrows.add((ax, ay))

    @staticmethod
    def _draw_box(n: LayoutNode, x, y, x_end, y_end, chars, tags, masks) -> None:
        label = fit_label(n.label, n.width - 4).center(max(n.width - 4, 0))
        bottom = n.y + n.height - 1
        for cy in range(max(n.y, y), min(bottom, y_end - 1) + 1):
            for cx in range(max(n.x, x), min(n.x + n.width - 1, x_end - 1) + 1):
                left, right = cx == n.x, cx == n.x + n.width - 1
                if cy == n.y or cy == bottom:
                    if left:
                        ch = "┌" if cy == n.y else "└"
                    elif right:
                        ch = "┐" if cy == n.y else "┘"
                    else:
                        joined = masks.get((cx, cy), 0)
                        ch = "┴" if cy == n.y and joined & UP else "┬" if cy == bottom and joined & DOWN else "─"
                elif left or right:
                    ch = "│"
                else:
                    k = cx - n.x - 2
                    ch = label[k] if 0 <= k < len(label) else " "
                chars[cy - y][cx - x] = ch
                tags[cy - y][cx - x] = n.role


def _segments(chars: list[str], tags: list[str | None]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    start = 0
    for k in range(1, len(chars) + 1):
        if k == len(chars) or tags[k] != tags[start]:
            out.append(Segment("".join(chars[start:k]), tags[start]))
            start = k
    return tuple(out)


def render_text(layout: GraphLayout) -> str:
    """The whole layout as plain text (for small graphs, tests and `onnxgrad graph -o FILE.txt`)."""
    return "\n".join(line.rstrip() for line in Canvas(layout).lines())
