"""Every node and tensor in one list, with fuzzy search (`/`) and jump-to on Enter."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

MAX_HITS = 300


@dataclass(frozen=True)
class Entry:
    key: str  # "n:<index>" or "t:<tensor>"
    name: str
    detail: str
    node_index: int | None
    tensor: str | None


def entries_for(graph) -> list[Entry]:
    """Inputs and initializers first, then each node followed by the tensors it produces."""
    out = []
    for t in list(graph.inputs) + list(graph.initializers):
        out.append(Entry(f"t:{t}", t, _shape(graph, t), None, t))
    for i, node in enumerate(graph.nodes):
        out.append(Entry(f"n:{i}", graph.node_names[i], node.op_type, i, None))
        for t in node.output:
            if t:
                out.append(Entry(f"t:{t}", t, _shape(graph, t), None, t))
    return out


def _shape(graph, t: str) -> str:
    info = graph.types.get(t)
    if info is None or info.shape is None:
        return ""
    return "[" + ",".join(str(d) if d not in (None, "") else "?" for d in info.shape) + "]"


def fuzzy_score(query: str, text: str) -> float:
    """0 when `query` is not a subsequence of `text` (case-insensitive); more for runs and prefixes."""
    q, t = query.lower(), text.lower()
    if not q:
        return 1.0
    if q in t:
        return 100.0 + (50.0 if t.startswith(q) else 0.0) - len(t) * 0.1
    score, pos, run = 0.0, 0, 0
    for ch in q:
        found = t.find(ch, pos)
        if found < 0:
            return 0.0
        run = run + 1 if found == pos else 0
        score += 1.0 + run * 2.0 + (3.0 if found == 0 or not t[found - 1].isalnum() else 0.0)
        pos = found + 1
    return score - len(t) * 0.05


def search(entries: list[Entry], query: str, limit: int = MAX_HITS) -> list[Entry]:
    if not query.strip():
        return entries
    scored = [(fuzzy_score(query, f"{e.name} {e.detail}"), k, e) for k, e in enumerate(entries)]
    hits = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))
    return [e for _, _, e in hits[:limit]]


class NodeList(Vertical):
    BINDINGS = [Binding("escape", "close_search", "Close search", show=False, id="list.close_search")]
    DEFAULT_CSS = """
    NodeList { width: 28; border-right: solid $panel; }
    NodeList > Input { display: none; height: 3; }
    NodeList.-searching > Input { display: block; }
    NodeList > OptionList { height: 1fr; border: none; }
    """

    @dataclass
    class Picked(Message):
        """An entry was highlighted (jump=False) or chosen with Enter (jump=True)."""

        node_index: int | None
        tensor: str | None
        jump: bool

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.entries: list[Entry] = []
        self.shown: list[Entry] = []
        self._echo: str | None = None  # a highlight we set ourselves: not announced back

    def compose(self) -> ComposeResult:
        yield Input(placeholder="fuzzy search: name or op", id="node-search")
        yield OptionList(id="node-options")

    def set_graph(self, graph) -> None:
        self.entries = entries_for(graph)
        self._show(self.entries)

    def _show(self, entries: list[Entry]) -> None:
        self.shown = entries
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(_prompt(e), id=e.key) for e in entries])

    def open_search(self) -> None:
        self.add_class("-searching")
        self.query_one(Input).focus()

    def action_close_search(self) -> None:
        box = self.query_one(Input)
        if self.has_class("-searching"):
            self.remove_class("-searching")
            if box.value:
                box.value = ""
                self._show(self.entries)
            self.query_one(OptionList).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._show(search(self.entries, event.value))
        if self.shown:
            self.query_one(OptionList).highlighted = 0

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.shown:
            e = self.shown[self.query_one(OptionList).highlighted or 0]
            self.post_message(self.Picked(e.node_index, e.tensor, jump=True))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option_index is None or event.option_index >= len(self.shown):
            return
        if event.option.id == self._echo:
            self._echo = None
            return
        e = self.shown[event.option_index]
        self.post_message(self.Picked(e.node_index, e.tensor, jump=False))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        e = self.shown[event.option_index]
        self.post_message(self.Picked(e.node_index, e.tensor, jump=True))

    def highlight(self, node_index: int | None, tensor: str | None) -> None:
        """Follow a cursor moved elsewhere, without announcing it back."""
        key = f"t:{tensor}" if tensor is not None and node_index is None else f"n:{node_index}"
        options = self.query_one(OptionList)
        try:
            index = options.get_option_index(key)
        except Exception:
            return
        if options.highlighted != index:
            self._echo = key
            options.highlighted = index


def _prompt(e: Entry) -> Text:
    if e.node_index is not None:
        return Text.assemble(("◆ ", "bold"), (e.name, "bold"), " ", (e.detail, "italic dim"))
    return Text.assemble("  ", e.name, " ", (e.detail, "dim"))
