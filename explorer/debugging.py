"""Chasing a gradient bug: the culprit (the first failing node, else where NaN/Inf starts) and the
tensor or node a result row names."""
from __future__ import annotations

from typing import Protocol

from .host import Shown, Ui
from .verdicts import culprit


class DebuggingApp(Ui, Protocol):
    def move_cursor(self, node_index: int | None, tensor: str | None) -> None: ...


class DiffWhere(Protocol):
    """Diff mode's colours (diffing.Diffing): `n` turns them to the direction its culprit diverges in."""

    def show_where(self, where: str) -> None: ...


class Debugging:
    """Takes the cursor to where the results point: the `n` key and Enter on a result row."""

    def __init__(self, shown: Shown, app: DebuggingApp, diffing: DiffWhere | None = None):
        self.shown, self.app, self.diffing = shown, app, diffing

    def culprit(self):
        """In diff mode, the diff's culprit (diff_state.DiffCulprit); else the check's or the run's."""
        s = self.shown.session
        if s is not None and s.diff is not None:
            return s.diff.culprit(s.graph)
        return None if s is None else culprit(s.check, s.gradient_origin)

    def go_to_culprit(self, quiet: bool = False) -> None:
        """Move the graph and inspector to the culprit node, its telling tensor on show."""
        found = self.culprit()
        names = self.shown.session.graph.node_names
        diff = self.shown.session.diff
        if found is None or found.node not in names:
            if not quiet:
                why = "the diff found no divergence" if diff is not None else "no failing node and no NaN/Inf"
                self.app.notify(f"nothing to go to: {why}", severity="warning", timeout=3)
            return
        if diff is not None and diff.where != found.where and self.diffing is not None:
            self.diffing.show_where(found.where)
        self.app.move_cursor(names.index(found.node), found.tensor)
        if not quiet:
            self.app.notify(found.why, title=found.node, timeout=8)

    def jump(self, node: str | None, tensor: str | None, index: tuple | None) -> None:
        """To a result row's node (and its tensor, when the node reads or writes it), else to its tensor,
        pointing the heatmap at the element `index` of the tensor's gradient."""
        g = self.shown.session.graph
        if node is not None:
            if node in g.node_names:
                k = g.node_names.index(node)
                self.app.move_cursor(k, tensor if tensor in g.nodes[k].input or tensor in g.nodes[k].output else None)
            return
        self.app.move_cursor(g.producer.get(tensor), tensor)
        inspector = self.app.query_one("#inspector")
        if index is not None:
            inspector.heat_source = "gradient"
            inspector.point_at(index)
