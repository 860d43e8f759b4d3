"""The navigator's rows: a list that draws only its visible rows, for the ~4,000 of densenet."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.segment import Segment
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..guard import guarded
from .labels import fit_labels, middle_cut
from .sizing import FixedBox

if TYPE_CHECKING:
    from .node_list import Entry

# Up to this many names, labels for a new width are fitted as the list is drawn; more are fitted in
# a worker (GPT-2's 4,797 names took 0.7 s, and a key pressed meanwhile waited for it).
INLINE_LABELS = 2_000
MARK_GLYPHS = {"fail": "✗ ", "inconclusive": "≈ ", "pass": "✓ "}


@guarded
class EntryList(FixedBox, ScrollView, can_focus=True):
    """A list that renders only its visible rows (an OptionList lays out every row up front,
    which takes seconds for densenet's ~4,000 nodes and tensors)."""

    BINDINGS = [
        Binding("up", "move(-1)", "Previous", show=False, id="list.previous"),
        Binding("down", "move(1)", "Next", show=False, id="list.next"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="list.page_up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="list.page_down"),
        Binding("home", "move(-1000000000)", "First", show=False, id="list.first"),
        Binding("end", "move(1000000000)", "Last", show=False, id="list.last"),
        Binding("enter", "choose", "Go to", show=False, id="list.choose"),
    ]
    COMPONENT_CLASSES = {"entry-list--highlight", "entry-list--node", "entry-list--detail", "entry-list--group",
                         "entry-list--fail", "entry-list--inconclusive", "entry-list--pass"}
    DEFAULT_CSS = """
    EntryList { height: 1fr; overflow-x: hidden; }
    EntryList > .entry-list--highlight { background: $accent 40%; text-style: bold; }
    EntryList:focus > .entry-list--highlight { background: $accent; }
    EntryList > .entry-list--node { text-style: bold; }
    EntryList > .entry-list--detail { color: $text-muted; }
    EntryList > .entry-list--group { color: $accent; text-style: bold; }
    EntryList > .entry-list--fail { color: $error; text-style: bold; }
    EntryList > .entry-list--inconclusive { color: $warning; }
    EntryList > .entry-list--pass { color: $success; }
    """

    @dataclass
    class LabelsWanted(Message):
        """The list is drawn at a width its labels were not fitted for (the NodeList fits them)."""

        names: list[str]
        width: int

    @dataclass
    class Moved(Message):
        entry_list: "EntryList"
        index: int
        chosen: bool

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.entries: list[Entry] = []
        self.highlighted: int | None = None
        self.chosen: int | None = None  # moved to, not yet highlighted: NodeList.Picked's handler shows it
        self.names: list[str] = []  # every name the list can show: labels are unique among them
        self.placeholder = ""  # shown while there are no entries
        self.collapsed: frozenset[str] = frozenset()
        self.marks: dict[int, str] = {}  # node index -> "fail" / "inconclusive" / "pass" (diff mode's colours)
        self._labels: tuple[int, dict[str, str]] = (-1, {})
        self._wanted = -1  # the width whose labels a worker is fitting
        self._styles: dict[str, object] = {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = {}

    def _style(self, name: str):
        """The list's style plus a component class's, cached until the styles change."""
        style = self._styles.get(name)
        if style is None:
            base = self.rich_style
            style = self._styles[name] = base + self.get_component_rich_style(f"entry-list--{name}") if name else base
        return style

    def set_names(self, names: list[str], labels: tuple[int, dict[str, str]] = (-1, {})) -> None:
        """`labels`: fit_labels of `names` at some width, if already made (in a worker)."""
        self.names = names
        self._labels = labels

    def label(self, name: str, width: int) -> str:
        """`name` cut to `width` cells, never into the label of another name (see labels.py); until
        the labels of a long list are fitted to a new width, cut in the middle."""
        if self._labels[0] != width:
            if len(self.names) > INLINE_LABELS:
                if self._wanted != width:
                    self._wanted = width
                    self.post_message(self.LabelsWanted(self.names, width))
                return middle_cut(name, width, (width - 1) // 2)
            self._labels = (width, fit_labels(self.names, width))
        return self._labels[1].get(name) or name[:width]

    def set_labels(self, names: list[str], width: int, labels: dict[str, str]) -> None:
        if names is self.names:
            self._labels = (width, labels)
            self.refresh()

    def set_entries(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.highlighted = 0 if entries else None
        self.chosen = None
        # One column wide: labels are cut to the width, so the list never scrolls sideways (as wide
        # as the widget, a vertical scrollbar made it 2 columns too wide, and a horizontal one came).
        self.virtual_size = Size(1, len(entries))
        self.scroll_to(0, 0, animate=False)
        self.refresh()

    def set_marks(self, marks: dict[int, str]) -> None:
        if marks != self.marks:
            self.marks = marks
            self.refresh()

    def reserve_rows(self, rows: int) -> None:
        """Scroll `rows` rows that are still being listed: the scrollbar the listing needs comes with
        the first frame, and the listing's arrival repaints the list alone (no screen layout)."""
        self.virtual_size = Size(1, rows)

    @property
    def current(self) -> int | None:
        """The entry the keys are on: the one moved to, even before it is drawn highlighted."""
        return self.chosen if self.chosen is not None else self.highlighted

    def highlight(self, index: int | None, center: bool = False) -> None:
        """`center`: a row out of view comes to the middle, not the edge (following a cursor moved
        elsewhere, the next moves then scroll nothing: a scroll repaints the list and its scrollbar)."""
        before, offset = self.highlighted, self.scroll_offset
        self.highlighted, self.chosen = index, None
        if index is not None:
            out_of_view = not self.scroll_y <= index < self.scroll_y + self.scrollable_content_region.height
            self.scroll_to_region(Region(0, index, 1, 1), animate=False, immediate=True, center=center and out_of_view)
            # Right after set_entries the new virtual size is not laid out yet: scroll again after it.
            self.call_after_refresh(self._scroll_to_highlight)
        if self.scroll_offset != offset:
            self.refresh()
            return
        for row in {before, index} - {None}:  # unscrolled, only these two rows change
            self.refresh_line(row)

    def _scroll_to_highlight(self) -> None:
        if self.highlighted is not None:
            self.scroll_to_region(Region(0, self.highlighted, 1, 1), animate=False, immediate=True)

    def action_move(self, delta: int) -> None:
        if not self.entries:
            return
        start = self.current if self.current is not None else -1
        index = max(0, min(len(self.entries) - 1, start + delta))
        if self.entries[index].group is not None:  # a heading moves no cursor: drawn here at once
            self.highlight(index)
        else:  # drawn with the panes that follow the cursor, in one frame
            self.chosen = index
        self.post_message(self.Moved(self, index, chosen=False))

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.scrollable_content_region.height - 1))

    def action_choose(self) -> None:
        if self.current is not None:
            self.post_message(self.Moved(self, self.current, chosen=True))

    def on_click(self, event: events.Click) -> None:
        index = event.y + int(self.scroll_y)
        if 0 <= index < len(self.entries):
            self.highlight(index)
            heading = self.entries[index].group is not None  # one click opens or closes a group
            self.post_message(self.Moved(self, index, chosen=event.chain > 1 or heading))

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        index = y + int(self.scroll_y)
        base = self._style("")
        if not 0 <= index < len(self.entries):
            text = self.placeholder if index == 0 and not self.entries else ""
            return Strip([Segment(text[:width].ljust(width), self._style("detail") if text else base)], width)
        e = self.entries[index]
        detail_style = self._style("detail")
        if e.group is not None:
            segments = [Segment(("▸ " if e.group in self.collapsed else "▾ ") + e.name, self._style("group"))]
        else:
            name_style = self._style("node") if e.node_index is not None else base
            glyph = "◆ " if e.node_index is not None else "  "
            if (mark := self.marks.get(e.node_index)) is not None:  # said by a sign too, not by colour alone
                name_style, glyph = self._style(mark), MARK_GLYPHS[mark]
            segments = [Segment(glyph, name_style),
                        Segment(self.label(e.name, width - 2), name_style), Segment(" " + e.detail, detail_style)]
        if index == self.highlighted:
            hl = self.get_component_rich_style("entry-list--highlight")
            segments = [Segment(seg.text, seg.style + hl) for seg in segments]
        return Strip(segments).crop_extend(0, width, base if index != self.highlighted else self._style("highlight"))
