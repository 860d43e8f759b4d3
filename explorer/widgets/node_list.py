"""Every node and tensor in one list, with search (`/`, ranked in ../search.py) and jump-to on Enter."""
from __future__ import annotations

from dataclasses import dataclass, replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input
from textual.worker import get_current_worker

from engine import pause_point

from ..guard import in_background
from ..search import SearchIndex
from .entry_list import INLINE_LABELS, EntryList
from .labels import fit_labels

UNSUPPORTED = "✗ unsupported"
LABELS_RETRY_S = 0.5


@dataclass(frozen=True)
class Entry:
    key: str  # "n:<index>", "t:<tensor>" or, for a group's heading, "g:<group>"
    name: str
    detail: str
    node_index: int | None
    tensor: str | None
    group: str | None = None  # set on a heading row only: the group it opens and closes


GROUPS = (("inputs", "Inputs"), ("outputs", "Outputs"), ("nodes", "Nodes"), ("weights", "Weights"))
COLLAPSED = frozenset({"weights"})  # thousands of rows nobody reads first: opened on demand


def grouped_entries(graph, unsupported=frozenset()) -> dict[str, list[Entry]]:
    """Inputs, outputs, nodes in topological order (each followed by the tensors it produces), weights.

    Nodes in `unsupported` (their op cannot run) say so after their op type."""
    def tensor(t: str) -> Entry:
        return Entry(f"t:{t}", t, _shape(graph, t), None, t)

    nodes = []
    for i, node in enumerate(graph.nodes):  # GraphIndex keeps nodes topologically sorted
        if not i & 255:
            pause_point()
        detail = f"{node.op_type} {UNSUPPORTED}" if i in unsupported else node.op_type
        nodes.append(Entry(f"n:{i}", graph.node_names[i], detail, i, None))
        nodes.extend(tensor(t) for t in node.output if t)
    return {"inputs": [tensor(t) for t in graph.inputs], "outputs": [tensor(t) for t in graph.outputs],
            "nodes": nodes, "weights": [tensor(t) for t in graph.initializers]}


def entries_for(graph, unsupported=frozenset(), groups=None) -> list[Entry]:
    """Every node and tensor once, in navigator order (what search looks through)."""
    seen: dict[str, Entry] = {}
    for entries in (groups or grouped_entries(graph, unsupported)).values():
        pause_point()
        for e in entries:
            seen.setdefault(e.key, e)
    return list(seen.values())


@dataclass(frozen=True)
class Listing:
    """A graph's navigator content, made in a worker: 15,000 entries are a third of a second."""

    groups: dict[str, list[Entry]]
    entries: list[Entry]
    finder: SearchIndex
    labels: tuple[int, dict[str, str]] = (-1, {})  # (width, fit_labels at that width), when known


def listing_for(graph, unsupported=frozenset(), width: int = -1) -> Listing:
    groups = grouped_entries(graph, unsupported)
    entries = entries_for(graph, unsupported, groups)
    labels = (width, fit_labels([e.name for e in entries], width)) if width > 0 else (-1, {})
    return Listing(groups, entries, SearchIndex(entries), labels)


def rows_for(groups: dict[str, list[Entry]], collapsed) -> list[Entry]:
    """The navigator's rows: a heading per non-empty group, its members unless collapsed."""
    rows = []
    for group, title in GROUPS:
        members = groups.get(group, [])
        if members:
            count = sum(e.node_index is not None for e in members) if group == "nodes" else len(members)
            rows.append(Entry(f"g:{group}", f"{title} ({count:,})", "", None, None, group))
            if group not in collapsed:
                rows.extend(members)
    return rows


def entry_key(node_index: int | None, tensor: str | None) -> str:
    """The key of the row of a node or, when `node_index` is None, of a tensor (Entry.key)."""
    return f"t:{tensor}" if tensor is not None and node_index is None else f"n:{node_index}"


def _shape(graph, t: str) -> str:
    info = graph.types.get(t)
    if info is None or info.shape is None:
        return ""
    return "[" + ",".join(str(d) if d not in (None, "") else "?" for d in info.shape) + "]"


class NodeList(Vertical):
    BINDINGS = [
        Binding("escape", "close_search", "Close search", show=False, id="list.close_search"),
        # While typing in the search box, up/down walk the hits (the list has no focus then).
        Binding("down", "hits(1)", "Next hit", show=False, id="list.next_hit"),
        Binding("up", "hits(-1)", "Previous hit", show=False, id="list.previous_hit"),
    ]
    DEFAULT_CSS = """
    NodeList { width: 28; border-right: solid $panel; }
    NodeList > Input { height: 1; margin-bottom: 1; }
    NodeList > EntryList { height: 1fr; }
    """

    @dataclass
    class Picked(Message):
        """An entry was moved to (jump=False) or chosen with Enter (jump=True). The handler draws
        it highlighted with `show_entry(picked)`, in the frame where the other panes follow."""

        node_index: int | None
        tensor: str | None
        jump: bool
        index: int = -1

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.entries: list[Entry] = []  # every node and tensor once: what search looks through
        self.finder = SearchIndex([])
        self.groups: dict[str, list[Entry]] = {}
        self.collapsed: set[str] = set(COLLAPSED)
        self.shown: list[Entry] = []
        self._index: dict[str, int] = {}
        self._last: tuple[int | None, str | None] | None = None
        self.graph = None

    def compose(self) -> ComposeResult:
        # Always shown: focusing a hidden box would wait a layout, and fast typing would miss it.
        yield Input(placeholder="/ search nodes, tensors", id="node-search", compact=True)
        yield EntryList(id="node-options")

    def set_graph(self, graph, unsupported=frozenset(), later: bool = False) -> None:
        """`later`: list the graph in a worker (the app paints first), showing a note until then."""
        self.graph = graph
        if later:
            self.set_listing(Listing({}, [], SearchIndex([])))
            view = self.query_one(EntryList)
            view.placeholder = f"listing {len(graph.nodes):,} nodes…"
            view.reserve_rows(len(graph.nodes))  # at least that many rows: more than a screen
            self.call_after_refresh(self._list_later, graph, unsupported)  # after the first frame
        else:
            self.set_listing(listing_for(graph, unsupported))

    def _list_later(self, graph, unsupported) -> None:
        # The labels for the width the list will have: fitting 15,000 names is 0.15 s the UI keeps.
        view = self.query_one(EntryList)
        region = view.scrollable_content_region
        bar = 0 if view.show_vertical_scrollbar else view.styles.scrollbar_size_vertical
        self._list_in_worker(graph, unsupported, region.width - 2, region.width - 2 - bar, region.height)

    @in_background("navigator")
    def _list_in_worker(self, graph, unsupported, width: int, with_scrollbar: int, height: int) -> None:
        listing = listing_for(graph, unsupported)
        width = with_scrollbar if len(rows_for(listing.groups, COLLAPSED)) > height else width
        names = [e.name for e in listing.entries]
        if len(names) <= INLINE_LABELS:  # more are listed first, cut in the middle, and fitted after
            listing = replace(listing, labels=(width, fit_labels(names, width)))
        if not get_current_worker().is_cancelled:
            self.post_message(self.Listed(graph, listing))

    def on_entry_list_labels_wanted(self, message: EntryList.LabelsWanted) -> None:
        message.stop()
        self._fit_labels(message.names, message.width)

    def _fit_labels(self, names: list[str], width: int) -> None:
        # The graph the user waits for goes first: fitting GPT-2 large's 13,917 labels is 2 s of the
        # interpreter the whole layout would share. Names are cut in the middle meanwhile.
        if any(w.group == "layout" and w.is_running for w in self.app.workers):
            self.app.put_off_for(self, LABELS_RETRY_S, lambda: self._fit_labels(names, width))
        elif names is self.query_one(EntryList).names:
            self._label_in_worker(names, width)

    @in_background("labels")
    def _label_in_worker(self, names: list[str], width: int) -> None:
        labels = fit_labels(names, width)
        if not get_current_worker().is_cancelled:
            self.post_message(self.Labelled(names, width, labels))

    @dataclass
    class Labelled(Message):
        names: list[str]  # the names fitted: labels of a list replaced since are dropped
        width: int
        labels: dict[str, str]

    def on_node_list_labelled(self, message: Labelled) -> None:
        message.stop()
        self.app.after_input(lambda: self.query_one(EntryList).set_labels(message.names, message.width, message.labels))

    @dataclass
    class Listed(Message):
        graph: object  # the engine.GraphIndex listed: a listing of a model closed since is dropped
        listing: Listing

    def on_node_list_listed(self, message: Listed) -> None:
        message.stop()
        self.app.after_input(lambda: self._listed(message))

    def _listed(self, message: Listed) -> None:
        if message.graph is self.graph:  # a listing of a model closed since is dropped
            self.set_listing(message.listing)

    def set_listing(self, listing: Listing) -> None:
        self.groups, self.entries, self.finder = listing.groups, listing.entries, listing.finder
        self.collapsed = set(COLLAPSED)
        listing_view = self.query_one(EntryList)
        listing_view.placeholder = ""
        listing_view.set_names([e.name for e in self.entries], listing.labels)
        query = self.query_one(Input).value
        self._show(self.finder.search(query) if query else self._rows())
        if self._last is not None and not query:
            self.highlight(*self._last)

    def _rows(self) -> list[Entry]:
        return rows_for(self.groups, self.collapsed)

    def _show(self, entries: list[Entry]) -> None:
        self.shown = entries
        listing = self.query_one(EntryList)
        listing.collapsed = frozenset(self.collapsed)
        listing.set_entries(entries)
        self._index = {}
        for k, e in enumerate(entries):
            self._index.setdefault(e.key, k)  # a graph output shows under Outputs first

    def toggle_group(self, group: str) -> None:
        self.collapsed ^= {group}
        self._show(self._rows())
        self.query_one(EntryList).highlight(self._index[f"g:{group}"])

    def set_marks(self, marks: dict[int, str]) -> None:
        """Colour node rows: node index -> "fail" / "inconclusive" / "pass" (diff mode); {} for none."""
        self.query_one(EntryList).set_marks(marks)

    def open_search(self) -> None:
        # Now, not after the keys already queued (Widget.focus waits its turn): typed right after
        # "/", they go into the box, not to the app's keys (t would toggle the dtype).
        self.screen.set_focus(self.query_one(Input))

    def action_close_search(self) -> None:
        self.close_search()
        self.query_one(EntryList).focus()

    def action_hits(self, delta: int) -> None:
        self.query_one(EntryList).action_move(delta)

    def close_search(self) -> None:
        """Hide the search box and show every entry again (the cursor stays where it is)."""
        box = self.query_one(Input)
        if box.value:
            box.value = ""
            self._show(self._rows())

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._show(self.finder.search(event.value) if event.value else self._rows())
        if not event.value:  # search closed: back to the whole list, at the entry last picked
            if self._last is not None:
                self.highlight(*self._last)
        elif self.shown:
            self.query_one(EntryList).highlight(0)
            self._announce(0, jump=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.shown:
            self._announce(self.query_one(EntryList).current or 0, jump=True)
        self.close_search()

    def on_entry_list_moved(self, event: EntryList.Moved) -> None:
        event.stop()
        self._announce(event.index, jump=event.chosen)

    def _announce(self, index: int, jump: bool) -> None:
        if 0 <= index < len(self.shown):
            e = self.shown[index]
            if e.group is not None:  # a heading moves no cursor; Enter or a click opens/closes it
                if jump:
                    self.toggle_group(e.group)
                return
            self._last = (e.node_index, e.tensor)
            self.post_message(self.Picked(e.node_index, e.tensor, jump=jump, index=index))

    def show_entry(self, picked: Picked) -> None:
        """Draw the entry `picked` announced highlighted: at its row if the list still shows it there,
        else where it is now (Enter on a search hit closes the search before the handler runs: the
        hit's row number is one of the whole list by then, and a weight's group may be closed)."""
        index = picked.index
        if 0 <= index < len(self.shown) and self.shown[index].key == entry_key(picked.node_index, picked.tensor):
            self.query_one(EntryList).highlight(index)
        else:
            self.highlight(picked.node_index, picked.tensor)

    def highlight(self, node_index: int | None, tensor: str | None) -> None:
        """Follow a cursor moved elsewhere, without announcing it back."""
        self._last = (node_index, tensor)
        key = entry_key(node_index, tensor)
        index = self._index.get(key)
        if index is None and not self.query_one(Input).value:  # in a closed group: open it
            group = next((g for g in self.collapsed if any(e.key == key for e in self.groups.get(g, ()))), None)
            if group is not None:
                self.collapsed.discard(group)
                self._show(self._rows())
                index = self._index.get(key)
        if index is not None:
            self.query_one(EntryList).highlight(index, center=True)


