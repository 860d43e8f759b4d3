"""A graph layout rasterized into terminal rows, queried one visible row at a time. No Textual.

Boxes are kept per row and drawn on request; edges become per-cell direction bits so crossings
and corners get the right box-drawing character. Building costs one pass over the edges' cells;
a row query costs only what lies in that row, which is what keeps a 1,746-node graph responsive.
"""
from __future__ import annotations

from dataclasses import dataclass

UP, DOWN, LEFT, RIGHT = 1, 2, 4, 8
EDGE_CHARS = {
    UP: "│", DOWN: "│", UP | DOWN: "│", LEFT: "─", RIGHT: "─", LEFT | RIGHT: "─",
    DOWN | RIGHT: "╭", DOWN | LEFT: "╮", UP | RIGHT: "╰", UP | LEFT: "╯",
    UP | DOWN | RIGHT: "├", UP | DOWN | LEFT: "┤", LEFT | RIGHT | DOWN: "┬", LEFT | RIGHT | UP: "┴",
    UP | DOWN | LEFT | RIGHT: "┼",
}
ARROWS = {DOWN: "▼", UP: "▲", LEFT: "◀", RIGHT: "▶"}


@dataclass(frozen=True)
class Run:
    """A stretch of one row: its text and what it belongs to (("box", node_id), ("edge", index) or None)."""

    text: str
    owner: tuple | None


BUCKET = 32  # rows per bucket of vertical segments


class Canvas:
    def __init__(self, layout):
        self.layout = layout
        self.nodes = {n.id: n for n in layout.nodes}
        self.box_rows: dict[int, list] = {}
        for n in layout.nodes:
            for r in range(n.y, n.y + n.height):
                self.box_rows.setdefault(r, []).append(n)
        for row in self.box_rows.values():
            row.sort(key=lambda n: n.x)
        # Edges as axis-aligned segments: horizontal ones by row, vertical ones by bucket of rows,
        # so neither building nor a row query ever walks an edge cell by cell.
        self.h_segments: dict[int, list[tuple[int, int, int]]] = {}  # y -> (x1, x2, edge)
        self.v_buckets: dict[int, list[tuple[int, int, int, int]]] = {}  # bucket -> (x, y1, y2, edge)
        self.arrows: dict[int, list[tuple[int, str, int]]] = {}  # y -> (x, char, edge)
        for k, e in enumerate(layout.edges):
            self._edge(k, e.points)

    def _edge(self, k: int, points) -> None:
        pts = [(int(round(x)), int(round(y))) for x, y in points]
        last = DOWN
        for (x1, y1), (x2, y2) in zip(pts, pts[1:]):
            # Non-axis-aligned pieces (spline samples) go vertical first, then horizontal.
            if y1 != y2:
                lo, hi = min(y1, y2), max(y1, y2)
                for b in range(lo // BUCKET, hi // BUCKET + 1):
                    self.v_buckets.setdefault(b, []).append((x1, lo, hi, k))
                last = DOWN if y2 > y1 else UP
            if x1 != x2:
                self.h_segments.setdefault(y2, []).append((min(x1, x2), max(x1, x2), k))
                last = RIGHT if x2 > x1 else LEFT
        if len(pts) >= 2:
            (_, py), (x, y) = pts[-2], pts[-1]
            if last == DOWN and y - 1 > py:  # the route ends on the target's top border: arrow above it
                y -= 1
            self.arrows.setdefault(y, []).append((x, ARROWS[last], k))

    def node_at(self, x: int, y: int):
        for n in self.box_rows.get(y, ()):
            if n.x <= x < n.x + n.width:
                return n
        return None

    def row(self, y: int, x0: int, width: int) -> list[Run]:
        """Row `y` of the drawing, columns [x0, x0 + width), as runs of equal ownership."""
        x_end = x0 + width
        bits = [0] * width
        owners: list[tuple | None] = [None] * width
        for x, y1, y2, k in self.v_buckets.get(y // BUCKET, ()):
            if y1 <= y <= y2 and x0 <= x < x_end:
                bits[x - x0] |= (UP if y > y1 else 0) | (DOWN if y < y2 else 0)
                owners[x - x0] = ("edge", k)
        for x1, x2, k in self.h_segments.get(y, ()):
            for x in range(max(x1, x0), min(x2, x_end - 1) + 1):
                bits[x - x0] |= (LEFT if x > x1 else 0) | (RIGHT if x < x2 else 0)
                owners[x - x0] = ("edge", k)
        chars = [EDGE_CHARS.get(b, "┼") if b else " " for b in bits]
        for x, ch, k in self.arrows.get(y, ()):
            if x0 <= x < x_end:
                chars[x - x0], owners[x - x0] = ch, ("arrow", k)
        for n in self.box_rows.get(y, ()):
            if n.x >= x_end or n.x + n.width <= x0:
                continue
            text = box_row(n, y - n.y)
            for i, ch in enumerate(text):
                c = n.x + i - x0
                if 0 <= c < width:
                    chars[c], owners[c] = ch, ("box", n.id)
        runs: list[Run] = []
        start = 0
        for i in range(1, width + 1):
            if i == width or owners[i] != owners[start]:
                runs.append(Run("".join(chars[start:i]), owners[start]))
                start = i
        return runs


def box_row(node, r: int) -> str:
    """Line r of a node's box: a border, or a label line centred between side borders."""
    w, h = node.width, node.height
    if r == 0:
        return "┌" + "─" * (w - 2) + "┐"
    if r == h - 1:
        return "└" + "─" * (w - 2) + "┘"
    lines = node.label.split("\n")
    inner = h - 2
    top = max(0, (inner - len(lines)) // 2)
    i = r - 1 - top
    text = lines[i] if 0 <= i < len(lines) else ""
    if len(text) > w - 2:
        text = text[: max(0, w - 3)] + "…"
    return "│" + text.center(w - 2) + "│"
