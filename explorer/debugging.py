"""Mixed into ExplorerApp: chasing a gradient bug. The dims dialog, the `n` key that goes to the
culprit (the first failing node, else where NaN/Inf starts) and Enter on a result row."""
from __future__ import annotations

from engine.errors import OnnxGradError
from engine.gradient.dims import symbolic_dims

from .guard import guarded
from .screens.dims import DimsScreen
from .verdicts import culprit


@guarded
class Debugging:
    def action_set_dims(self) -> None:
        s = self.session
        dims = symbolic_dims(s.graph)
        if not dims:
            self.notify("this model's inputs have no symbolic dims", severity="warning", timeout=3)
            return

        def try_dims(value) -> str | None:
            try:
                s.set_dims(value)
            except OnnxGradError as exc:
                return str(exc)
            return None

        def done(value) -> None:
            if value is None:
                return
            self.results_changed()
            self.request_values([self.cursor[1]] if self.cursor[1] else [])
            self.notify(f"dims: {s.dims_text()}", timeout=3)

        self.push_screen(DimsScreen(dims, s.dims, try_dims), done)

    def culprit(self):
        s = self.session
        return None if s is None else culprit(s.check, s.gradient_origin)

    def action_go_to_culprit(self) -> None:
        self.go_to_culprit()

    def go_to_culprit(self, quiet: bool = False) -> None:
        """Move the graph and inspector to the culprit node, its telling tensor on show."""
        found = self.culprit()
        names = self.session.graph.node_names
        if found is None or found.node not in names:
            if not quiet:
                self.notify("nothing to go to: no failing node and no NaN/Inf", severity="warning", timeout=3)
            return
        self.move_cursor(names.index(found.node), found.tensor)
        if not quiet:
            self.notify(found.why, title=found.node, timeout=8)

    def on_results_jump(self, event) -> None:
        g = self.session.graph
        if event.node is not None:
            if event.node in g.node_names:
                node = g.node_names.index(event.node)
                tensor = event.tensor if event.tensor in g.nodes[node].input or event.tensor in g.nodes[node].output \
                    else None
                self.move_cursor(node, tensor)
            return
        node = g.producer.get(event.tensor)
        self.move_cursor(node, event.tensor)
        inspector = self.query_one("#inspector")
        if event.index is not None:
            inspector.heat_source = "gradient"
            inspector.point_at(event.index)
