"""Draw a GraphLayout as text with box-drawing characters, one row at a time (no UI library needed).

`Canvas(layout).row(y, x0, width)` returns one row as Segments; `region(x, y, width, height)` one
tuple of Segments per row. A segment is a run of text with one owner — ("box", node id),
("edge", edge index), ("arrow", edge index) or None for blank cells — and that owner's tag: the
node's role ("x", "active", "backward", ...), "edge:<kind>" (data, output, cut, grad, partial) or
None. `onnxgrad graph -o FILE.txt` and the explorer's graph view both draw through this class:
the explorer with rounded edge corners and boxes drawn over the edges that meet them, text files
(`square=True`) with square corners and ┬/┴ where an edge leaves or enters a box.

Boxes are kept per row and edges as axis-aligned pieces (horizontal ones by row, vertical ones by
bucket of rows) whose direction bits pick the character at corners and crossings, so neither
building nor a row query walks an edge cell by cell: a viewport over a 2,000-node graph costs only
what it shows.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..run.pacing import paced, pause_point
from .layout import GraphLayout, LayoutNode, gc_paused

UP, DOWN, LEFT, RIGHT = 1, 2, 4, 8
EDGE_CHARS = {
    UP: "│", DOWN: "│", UP | DOWN: "│", LEFT: "─", RIGHT: "─", LEFT | RIGHT: "─",
    DOWN | RIGHT: "╭", DOWN | LEFT: "╮", UP | RIGHT: "╰", UP | LEFT: "╯",
    UP | DOWN | RIGHT: "├", UP | DOWN | LEFT: "┤", LEFT | RIGHT | DOWN: "┬", LEFT | RIGHT | UP: "┴",
    UP | DOWN | LEFT | RIGHT: "┼",
}
SQUARE_CORNERS = {DOWN | RIGHT: "┌", DOWN | LEFT: "┐", UP | RIGHT: "└", UP | LEFT: "┘"}
ARROWS = {DOWN: "▼", UP: "▲", LEFT: "◀", RIGHT: "▶"}
BUCKET = 32  # rows per bucket of vertical edge pieces


@dataclass(frozen=True)
class Segment:
    """A stretch of one row: its text, its tag (role or "edge:<kind>") and what it belongs to."""

    text: str
    tag: str | None
    owner: tuple | None = None


class Canvas:
    """A layout indexed by rows, ready to draw any row or viewport quickly."""

    def __init__(self, layout: GraphLayout, square: bool = False):
        with gc_paused():  # a big layout's index is a few hundred thousand small tuples
            self._index(layout, square)

    def _index(self, layout: GraphLayout, square: bool) -> None:
        self.layout = layout
        self.square = square
        self.edge_chars = EDGE_CHARS | SQUARE_CORNERS if square else EDGE_CHARS
        self.nodes = {n.id: n for n in layout.nodes}
        self.box_rows: dict[int, list[LayoutNode]] = {}
        for n in paced(layout.nodes):
            for r in range(n.y, n.y + n.height):
                self.box_rows.setdefault(r, []).append(n)
        for row in self.box_rows.values():
            row.sort(key=lambda n: n.x)
        self.h_segments: dict[int, list[tuple[int, int, int]]] = {}  # y -> (x1, x2, edge)
        self.v_buckets: dict[int, list[tuple[int, int, int, int]]] = {}  # bucket -> (x, y1, y2, edge)
        self.arrows: dict[int, list[tuple[int, str, int]]] = {}  # y -> (x, char, edge)
        # One owner tuple per box, edge and arrow, made once: a row query hands out these objects
        # (no allocation per cell) and finds each run's tag by them.
        self._box_owners = {n.id: ("box", n.id) for n in layout.nodes}
        self._edge_owners = [("edge", k) for k in range(len(layout.edges))]
        self._arrow_owners = [("arrow", k) for k in range(len(layout.edges))]
        self._tags: dict[tuple, str] = {self._box_owners[n.id]: n.role for n in layout.nodes}
        for k, e in enumerate(layout.edges):
            self._tags[self._edge_owners[k]] = self._tags[self._arrow_owners[k]] = f"edge:{e.kind}"
            self._edge(k, e.points)
            if not k & 31:
                pause_point()

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

    def node_at(self, x: int, y: int) -> LayoutNode | None:
        for n in self.box_rows.get(y, ()):
            if n.x <= x < n.x + n.width:
                return n
        return None

    def row(self, y: int, x0: int, width: int) -> list[Segment]:
        """Row `y` of the drawing, columns [x0, x0 + width), as runs of equal ownership."""
        chars, owners = self._cells(y, x0, width)
        tags = self._tags
        runs: list[Segment] = []
        start = 0
        for i in range(1, width + 1):
            if i == width or owners[i] is not owners[start]:
                owner = owners[start]
                runs.append(Segment("".join(chars[start:i]), tags.get(owner), owner))
                start = i
        return runs

    def _cells(self, y: int, x0: int, width: int) -> tuple[list[str], list[tuple | None]]:
        x_end = x0 + width
        bits = [0] * width
        owners: list[tuple | None] = [None] * width
        edge_owners = self._edge_owners
        for x, y1, y2, k in self.v_buckets.get(y // BUCKET, ()):
            if y1 <= y <= y2 and x0 <= x < x_end:
                bits[x - x0] |= (UP if y > y1 else 0) | (DOWN if y < y2 else 0)
                owners[x - x0] = edge_owners[k]
        for x1, x2, k in self.h_segments.get(y, ()):
            a, b = max(x1, x0), min(x2, x_end - 1)
            if a > b:
                continue
            for x in range(a, b + 1):
                bits[x - x0] |= (LEFT if x > x1 else 0) | (RIGHT if x < x2 else 0)
            owners[a - x0:b - x0 + 1] = [edge_owners[k]] * (b - a + 1)
        edge_chars = self.edge_chars
        chars = [edge_chars.get(b, "┼") if b else " " for b in bits]
        for x, ch, k in self.arrows.get(y, ()):
            if x0 <= x < x_end:
                chars[x - x0], owners[x - x0] = ch, self._arrow_owners[k]
        for n in self.box_rows.get(y, ()):
            if n.x >= x_end or n.x + n.width <= x0:
                continue
            text, owner = box_row(n, y - n.y), self._box_owners[n.id]
            if self.square and (y == n.y or y == n.y + n.height - 1):
                text = joined_border(text, n, y, bits, x0)
            a, b = max(n.x, x0), min(n.x + n.width, x_end)  # the columns of the box in view
            chars[a - x0:b - x0] = text[a - n.x:b - n.x]
            owners[a - x0:b - x0] = [owner] * (b - a)
        return chars, owners

    def region(self, x: int, y: int, width: int, height: int) -> list[tuple[Segment, ...]]:
        return [tuple(self.row(r, x, width)) for r in range(y, y + height)]

    def lines(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> list[str]:
        width = self.layout.width if width is None else width
        height = self.layout.height if height is None else height
        return ["".join(self._cells(r, x, width)[0]) for r in range(y, y + height)]


def box_row(node: LayoutNode, r: int) -> str:
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


def joined_border(text: str, node: LayoutNode, y: int, bits: list[int], x0: int) -> str:
    """A top or bottom border with ┴ where an edge comes in from above, ┬ where one leaves below."""
    bit, joint = (UP, "┴") if y == node.y else (DOWN, "┬")
    cells = list(text)
    for i in range(1, node.width - 1):
        c = node.x + i - x0
        if 0 <= c < len(bits) and bits[c] & bit:
            cells[i] = joint
    return "".join(cells)


def render_text(layout: GraphLayout) -> str:
    """The whole layout as plain text (for small graphs, tests and `onnxgrad graph -o FILE.txt`)."""
    return "\n".join(line.rstrip() for line in Canvas(layout, square=True).lines())
