"""The DAG in the terminal: boxes and arrows from a GraphLayout, drawing only the visible rows."""
from __future__ import annotations

import textwrap
from bisect import bisect_left
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from engine.graphs import Canvas

from ..guard import guarded
from ..marks import box_tensor
from .sizing import FixedBox

MARKS = ("current", "fail", "inconclusive", "pass", "unsupported", "y", "x", "z", "slice", "dim")


@guarded
class GraphView(FixedBox, ScrollView, can_focus=True):
    """Arrows move between boxes (the view follows); shift+arrows pan; a click picks a box."""

    BINDINGS = [
        Binding("up", "move(0, -1)", "Up", show=False, id="graph.move_up"),
        Binding("down", "move(0, 1)", "Down", show=False, id="graph.move_down"),
        Binding("left", "move(-1, 0)", "Left", show=False, id="graph.move_left"),
        Binding("right", "move(1, 0)", "Right", show=False, id="graph.move_right"),
        Binding("shift+up", "pan(0, -4)", "Pan up", show=False, id="graph.pan_up"),
        Binding("shift+down", "pan(0, 4)", "Pan down", show=False, id="graph.pan_down"),
        Binding("shift+left", "pan(-8, 0)", "Pan left", show=False, id="graph.pan_left"),
        Binding("shift+right", "pan(8, 0)", "Pan right", show=False, id="graph.pan_right"),
    ]
    COMPONENT_CLASSES = {"graph-view--edge", "graph-view--edge-hot", "graph-view--box", "graph-view--selected",
                         "graph-view--tensor"} | {f"graph-view--{m}" for m in MARKS}
    DEFAULT_CSS = """
    GraphView { background: $surface; }
    GraphView > .graph-view--edge { color: $text-muted; }
    GraphView > .graph-view--edge-hot { color: $warning; }
    GraphView > .graph-view--box { color: $text; }
    GraphView > .graph-view--tensor { color: $text-muted; }
    GraphView > .graph-view--selected { text-style: reverse bold; }
    GraphView > .graph-view--current { color: $background; background: $warning; text-style: bold; }
    GraphView > .graph-view--fail { color: $error; text-style: bold; }
    GraphView > .graph-view--inconclusive { color: $warning; }
    GraphView > .graph-view--pass { color: $success; }
    GraphView > .graph-view--unsupported { color: $error; text-style: italic strike; }
    GraphView > .graph-view--y { color: $accent; text-style: bold; }
    GraphView > .graph-view--x { color: $success; text-style: bold; }
    GraphView > .graph-view--z { color: $primary; text-style: bold; }
    GraphView > .graph-view--slice { color: $text; text-style: bold; }
    GraphView > .graph-view--dim { color: $text-disabled; }
    """

    @dataclass
    class NodeChosen(Message):
        """A box was moved to or clicked: node index (None for a tensor box) and tensor name.
        The handler shows it with `graph_view.select(box, scroll)`, in the same frame as the
        other panes follow the cursor (drawing it here first cost a frame per key)."""

        graph_view: "GraphView"
        node_index: int | None
        tensor: str | None
        box: str = ""
        scroll: bool = True

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.canvas: Canvas | None = None
        self.placeholder = "laying out the graph…"
        self.marks: dict[str, str] = {}
        self.selected: str | None = None
        self.chosen: str | None = None  # announced, not yet shown: the next arrow moves from it
        self._styles: dict = {}

    # --- content -----------------------------------------------------------------------------
    def set_layout(self, layout, placeholder: str = "", canvas: Canvas | None = None) -> None:
        """`canvas`: the layout's Canvas made by `prepare_canvas` in a worker (else made here)."""
        self.canvas = (canvas if canvas is not None and canvas.layout is layout else Canvas(layout)) \
            if layout is not None else None
        self.placeholder = placeholder
        self.virtual_size = Size(layout.width + 1, layout.height + 1) if layout is not None else Size(0, 0)
        if self.selected is not None and (self.canvas is None or self.selected not in self.canvas.nodes):
            self.selected = None
        self.chosen = None
        self.refresh()
        # The new virtual size is laid out only after this refresh: scrolling now would be clamped.
        self.call_after_refresh(self.keep_in_view)

    def set_marks(self, marks: dict[str, str]) -> None:
        self.marks = marks
        self.refresh()

    def ids_for(self, node_index: int | None = None, tensor: str | None = None) -> list[str]:
        """Layout ids of the boxes that show a forward node (or its backward twin) or a tensor."""
        if self.canvas is None:
            return []
        by_node, by_tensor = self._box_index()
        ids = by_node.get(node_index, []) if node_index is not None else []
        return ids + by_tensor.get(tensor, []) if tensor is not None else ids

    def _box_index(self) -> tuple[dict, dict]:
        return _box_index(self.canvas)

    def select(self, node_id: str | None, scroll: bool = True) -> None:
        if self.canvas is None or node_id not in self.canvas.nodes:
            return
        before, offset = self.selected, self.scroll_offset
        self.selected = node_id
        if self.chosen == node_id:
            self.chosen = None
        n = self.canvas.nodes[node_id]
        if scroll:
            self._reveal(n)
            self.call_after_refresh(self.keep_in_view)  # in case the size is not laid out yet
        if self.scroll_offset != offset:
            self.refresh()
            return
        self._repaint_boxes(before, node_id)

    def deselect(self) -> None:
        """No box selected: the cursor is on something this view draws no box for."""
        before, self.selected = self.selected, None
        self._repaint_boxes(before)

    def _repaint_boxes(self, *ids: str | None) -> None:
        # Only these boxes' rows look different (edges do not show the selection): the whole pane
        # re-rendered was a third of an arrow key's frame on GPT-2.
        for box in ids:
            if self.canvas is not None and (n := self.canvas.nodes.get(box)) is not None:
                self.refresh_lines(n.y, n.height)

    def choose(self, node_id: str, scroll: bool = True) -> None:
        """Announce a move to `node_id`; the NodeChosen handler selects it."""
        self.chosen = node_id
        n = self.canvas.nodes[node_id]
        self.post_message(self.NodeChosen(self, n.node_index, box_tensor(n) if n.node_index is None else None,
                                          node_id, scroll))

    def keep_in_view(self) -> None:
        """Scroll the selected box (else the graph's first box) into view: the pane is never blank."""
        if self.canvas is None or not self.canvas.nodes:
            return
        n = self.canvas.nodes.get(self.selected) if self.selected is not None else None
        if n is None:
            n = self._first_box()
        if not self._visible(n):
            self._reveal(n)

    def _rows_of_boxes(self) -> tuple[list[int], dict[int, list]]:
        return _rows_of_boxes(self.canvas)

    def _first_box(self):
        return _first_box(self.canvas)

    def _reveal(self, n) -> None:
        # force: right after a new layout the scrollbars are not decided yet, and without them
        # Textual refuses to scroll (the pane stayed at the blank top-left corner of densenet).
        self.scroll_to_region(Region(n.x, n.y, n.width, n.height), animate=False, spacing=None,
                              center=not self._visible(n), immediate=True, force=True)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.keep_in_view)

    def _visible(self, n) -> bool:
        x, y = self.scroll_offset
        w, h = self.scrollable_content_region.size
        return x <= n.x and n.x + n.width <= x + w and y <= n.y and n.y + n.height <= y + h

    # --- keys and mouse ----------------------------------------------------------------------------
    def action_move(self, dx: int, dy: int) -> None:
        """Select the nearest box in a direction, preferring boxes roughly in line."""
        if self.canvas is None or not self.canvas.nodes:
            return
        current = self.chosen if self.chosen in self.canvas.nodes else self.selected
        if current is None:
            self.choose(self._first_box().id)
            return
        best = self.nearest(self.canvas.nodes[current], dx, dy)
        if best is not None:
            self.choose(best.id)

    def nearest(self, cur, dx: int, dy: int):
        """The box an arrow key moves to from `cur`: ahead in the direction, the least
        distance along it plus 2.5 times the distance across."""
        cx, cy = cur.x + cur.width / 2, cur.y + cur.height / 2
        best, best_score = None, None
        # Rows of boxes nearest first; a row |oy| away scores at least |oy| (moving up or down) or
        # 2.5 |oy| (sideways), so the walk stops as soon as no farther row can win.
        tops, rows = self._rows_of_boxes()
        k = bisect_left(tops, cur.y)
        below, above = k, k - 1
        while below < len(tops) or above >= 0:
            if above < 0 or (below < len(tops) and tops[below] - cur.y <= cur.y - tops[above]):
                y, below = tops[below], below + 1
            else:
                y, above = tops[above], above - 1
            if best_score is not None and abs(y - cur.y) * (2.5 if dx else 1.0) > best_score:
                break
            for n in rows[y]:
                if n.id == cur.id:
                    continue
                ox, oy = n.x + n.width / 2 - cx, n.y + n.height / 2 - cy
                along, across = (ox * dx, abs(oy)) if dx else (oy * dy, abs(ox))
                if along <= 0:
                    continue
                score = along + 2.5 * across
                if best_score is None or score < best_score or (score == best_score and n.id < best.id):
                    best, best_score = n, score
        return best

    def action_pan(self, dx: int, dy: int) -> None:
        self.scroll_to(self.scroll_x + dx, self.scroll_y + dy, animate=False)

    def on_click(self, event: events.Click) -> None:
        if self.canvas is None:
            return
        x, y = event.x + int(self.scroll_x), event.y + int(self.scroll_y)
        n = self.canvas.node_at(x, y)
        if n is not None:
            self.choose(n.id, scroll=False)

    # --- drawing -----------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = {}

    def _style(self, name: str) -> Style:
        """The widget's style plus a component class's, cached until the styles change
        (`rich_style` walks the ancestors: computing it per run cost a third of a key press)."""
        style = self._styles.get(name)
        if style is None:
            base = self.rich_style
            style = self._styles[name] = base + self.get_component_rich_style(f"graph-view--{name}") if name else base
        return style

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self._style("")
        if self.canvas is None:
            lines = textwrap.wrap(self.placeholder, max(1, width - 2))  # a narrow pane wraps, never cuts
            text = lines[y - 1].center(width)[:width] if 1 <= y <= len(lines) else " " * width
            return Strip([Segment(text, base + Style(dim=True))], width)
        sx, sy = int(self.scroll_x), int(self.scroll_y)
        segments = []
        for run in self.canvas.row(sy + y, sx, width):
            segments.append(Segment(run.text, self._run_style(run.owner)))
        return Strip(segments, width)

    def _run_style(self, owner) -> Style:
        if owner is None:
            return self._style("")
        kind, key = owner
        if kind == "box":
            mark = self.marks.get(key)
            if mark is None:
                mark = "tensor" if self.canvas.nodes[key].node_index is None else "box"
            if key == self.selected:
                combined = self._styles.get(("selected", mark))
                if combined is None:
                    combined = self._styles[("selected", mark)] = self._style(mark) + self._style("selected")
                return combined
            return self._style(mark)
        edge = self.canvas.layout.edges[key]
        hot = self.marks.get(edge.source) not in (None, "dim") and self.marks.get(edge.target) not in (None, "dim")
        return self._style("edge-hot" if hot else "edge")


def prepare_canvas(layout) -> Canvas:
    """A layout's Canvas with the indexes the view keeps on it, made off the UI thread: on the
    10,001-node model they are a quarter of a second the UI would otherwise freeze for."""
    canvas = Canvas(layout)
    _box_index(canvas)
    _rows_of_boxes(canvas)
    if canvas.nodes:
        _first_box(canvas)
    return canvas


def _box_index(canvas) -> tuple[dict, dict]:
    """Boxes by node index and by tensor, made once per layout (a key must not scan 12,000 boxes)."""
    index = getattr(canvas, "box_index", None)
    if index is None:
        by_node: dict[int, list[str]] = {}
        by_tensor: dict[str, list[str]] = {}
        for n in canvas.layout.nodes:
            if n.node_index is not None:
                by_node.setdefault(n.node_index, []).append(n.id)
            elif (t := box_tensor(n)) is not None:
                by_tensor.setdefault(t, []).append(n.id)
        index = canvas.box_index = (by_node, by_tensor)
    return index


def _rows_of_boxes(canvas) -> tuple[list[int], dict[int, list]]:
    rows = getattr(canvas, "box_tops", None)
    if rows is None:
        by_top: dict[int, list] = {}
        for n in canvas.layout.nodes:
            by_top.setdefault(n.y, []).append(n)
        rows = canvas.box_tops = (sorted(by_top), by_top)
    return rows


def _first_box(canvas):
    first = getattr(canvas, "first_box", None)
    if first is None:
        first = canvas.first_box = min(canvas.nodes.values(), key=lambda n: (n.y, n.x))
    return first
