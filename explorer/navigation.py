"""The cursor: the node and tensor every pane follows (graph box, navigator row, inspector)."""
from __future__ import annotations

from typing import Protocol

from . import messages as m
from .host import Shown, Ui


class NavigationApp(Ui, Protocol):
    def request_values(self, names) -> None: ...

    def refresh_footer(self, force: bool = False) -> None: ...


class GraphPane(Protocol):
    """Where the cursor is in the graph pane (graph_work.LayoutWork)."""

    def show_cursor(self, node_index: int | None, tensor: str | None) -> None: ...

    def follow_local(self, node_index: int | None, tensor: str | None) -> None: ...


class Navigation:
    """Moves `shown.cursor` and shows it in every pane but the one it was moved in (`origin`);
    the tensor's values are asked for and the move announced as `CursorMoved`."""

    def __init__(self, shown: Shown, app: NavigationApp, graph: GraphPane):
        self.shown, self.app, self.graph = shown, app, graph

    def move(self, node_index: int | None, tensor: str | None, origin: str = "", announce: bool = True) -> None:
        s = self.shown.session
        if s is None or (node_index, tensor) == self.shown.cursor:
            return
        if node_index is not None and tensor is None:
            tensor = first_output(s.graph, node_index)
        self.shown.cursor = (node_index, tensor)
        if origin != "graph":
            self.graph.show_cursor(node_index, tensor)
        if origin != "list":
            self.app.query_one("#node-list").highlight(node_index, tensor)
        self.app.query_one("#inspector").show(s, node_index, tensor)
        if tensor is not None:
            self.app.request_values([tensor])
        self.app.refresh_footer()
        if announce:
            self.app.post_message(m.CursorMoved(node_index, tensor))

    def chosen_in_graph(self, graph_view, node_index: int | None, tensor: str | None, box: str, scroll: bool) -> None:
        graph_view.select(box, scroll=scroll)
        self.move(node_index, tensor, origin="graph")
        self.graph.follow_local(node_index, tensor)

    def picked_in_list(self, picked) -> None:
        """`picked`: a NodeList.Picked, drawn highlighted in the navigator in this frame."""
        self.app.query_one("#node-list").show_entry(picked)
        self.move(picked.node_index, picked.tensor, origin="list")
        if picked.jump:
            self.app.query_one("#graph").focus()

    def next_tensor(self) -> None:
        """The node's next tensor (outputs, then inputs); from an input or weight, its first reader."""
        s = self.shown.session
        node, tensor = self.shown.cursor
        if node is None:
            readers = s.graph.consumers.get(tensor, [])
            if readers:
                self.move(readers[0], tensor)
            else:
                self.app.notify(f"no node reads {tensor}", severity="warning", timeout=3)
            return
        n = s.graph.nodes[node]
        names = [t for t in list(n.output) + list(n.input) if t]
        k = names.index(tensor) + 1 if tensor in names else 0
        self.shown.cursor = (node, names[k % len(names)])
        self.app.query_one("#inspector").show(s, *self.shown.cursor)
        self.app.request_values([self.shown.cursor[1]])
        self.app.post_message(m.CursorMoved(*self.shown.cursor))


def first_output(graph, i: int) -> str | None:
    return next((t for t in graph.nodes[i].output if t), None)
