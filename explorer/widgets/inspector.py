"""The inspector: what the cursor is on — node, tensor, values, gradient, a heatmap slice."""
from __future__ import annotations

import numpy as np
from onnx import helper
from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Input, Static

from ..guard import guarded
from ..rules import rule_lines
from .visuals import heatmap, histogram, parse_slice, stats_text

ROLE_NAMES = {"x": "in xs", "z": "in zs", "y": "is y"}


@guarded
class Inspector(VerticalScroll):
    # Tab can land in the slice box, where letters are text, not keys: escape hands them back.
    BINDINGS = [Binding("escape", "leave", "Back to the graph", show=False, id="inspector.leave")]
    DEFAULT_CSS = """
    Inspector { width: 50; border-left: solid $panel; padding: 0 1; }
    Inspector > #inspector-info { height: auto; }
    Inspector > #inspector-slice { display: none; height: 3; }
    Inspector.-sliceable > #inspector-slice { display: block; }
    Inspector > #inspector-heat { height: auto; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.session = None
        self.node_index: int | None = None
        self.tensor: str | None = None
        self.heat_source = "value"  # or "gradient"
        self.lead: tuple[int, ...] = ()
        self.focus_element: tuple[int, ...] | None = None
        self.has_heatmap = False

    def compose(self) -> ComposeResult:
        yield Static(id="inspector-info")
        yield Input(placeholder="slice: leading indices, e.g. 0,1", id="inspector-slice")
        yield Static(id="inspector-heat")

    def show(self, session, node_index: int | None, tensor: str | None) -> None:
        if (node_index, tensor) != (self.node_index, self.tensor):
            self.lead, self.focus_element = (), None
        self.session, self.node_index, self.tensor = session, node_index, tensor
        self.refresh_content()

    def point_at(self, index: tuple[int, ...]) -> None:
        """Show the slice holding element `index` with that element marked (jump to worst)."""
        self.focus_element = tuple(int(i) for i in index)
        self.lead = self.focus_element[:-2] if len(self.focus_element) > 2 else ()
        self.refresh_content()

    def action_leave(self) -> None:
        """Escape here cancels running work first, as it does everywhere; else it returns to the graph."""
        if self.app.check_action("cancel", ()):
            self.app.action_cancel()
        else:
            self.app.query_one("#graph").focus()

    def toggle_heat_source(self) -> str:
        self.heat_source = "gradient" if self.heat_source == "value" else "value"
        self.refresh_content()
        return self.heat_source

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        arr = self._heat_array()
        if arr is None:
            return
        try:
            self.lead, canon = parse_slice(event.value, arr.shape)
        except ValueError as exc:
            self.notify(str(exc), severity="warning")
            return
        event.input.value = canon
        self.focus_element = None
        self.refresh_content()

    # --- content -------------------------------------------------------------------------------
    def refresh_content(self) -> None:
        s = self.session
        if s is None:
            return
        parts = []
        if self.node_index is not None:
            parts.append(self._node_text(s, self.node_index))
        if self.tensor is not None:
            parts.append(self._tensor_text(s, self.tensor))
        if not parts:
            parts.append(Text("Move in the graph (arrows) or the list to inspect a node or tensor.", style="dim"))
        _update(self.query_one("#inspector-info", Static), Group(*parts))
        arr = self._heat_array()
        heat = self.query_one("#inspector-heat", Static)
        self.has_heatmap = arr is not None and arr.size > 0
        if not self.has_heatmap:
            _update(heat, "")
            self.remove_class("-sliceable")
            return
        self.set_class(arr.ndim > 2, "-sliceable")
        if len(self.lead) != max(0, arr.ndim - 2):
            self.lead = (0,) * max(0, arr.ndim - 2)
        focus = None
        if self.focus_element is not None and len(self.focus_element) >= 2:
            focus = self.focus_element[-2:]
        elif self.focus_element is not None and len(self.focus_element) == 1:
            focus = (0, self.focus_element[0])
        title = Text(f"heatmap of {self.heat_source} {self.tensor}"
                     + (f"[{','.join(map(str, self.lead))},:,:]" if self.lead else ""), style="bold")
        _update(heat, Group(title, heatmap(arr, self.lead, focus)))

    def _heat_array(self):
        s, t = self.session, self.tensor
        if s is None or t is None:
            return None
        if self.heat_source == "gradient":
            if s.gradient is not None and t in s.gradient.grads:
                return np.asarray(s.gradient.grads[t])
            return None
        v = s.values.get(t)
        return None if v is None or isinstance(v, list) else np.asarray(v)

    def _node_text(self, s, i: int) -> Text:
        g = s.graph
        node = g.nodes[i]
        t = Text()
        t.append(f"{g.node_names[i]}", style="bold")
        t.append(f"  {node.domain + '::' if node.domain else ''}{node.op_type}\n", style="italic")
        if i in s.model.unsupported_nodes():
            t.append("unsupported: onnxgrad has no implementation of this op; register one with --ops FILE.py\n",
                     style="bold red")
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            v = v.decode() if isinstance(v, bytes) else v
            text = repr(v) if not hasattr(v, "dims") else f"tensor{tuple(v.dims)}"
            t.append(f"  {a.name} = {text[:34]}\n", style="dim")
        t.append("in  ", style="bold")
        t.append(", ".join(x or "∅" for x in node.input) + "\n")
        t.append("out ", style="bold")
        t.append(", ".join(x for x in node.output if x) + "\n")
        functions = getattr(s.gradient_stats, "torch_functions", {}).get(i) if s.gradient_stats else None
        if functions:
            t.append(f"autograd: {', '.join(functions)[:80]}\n", style="dim")
        status = _check_status(s, g.node_names[i])
        if status:
            t.append(f"check: {status}\n", style="bold red" if status == "fail" else "bold")
        if i in s.slice_nodes():
            t.append("local rule:\n", style="bold")
            for (sym, rule), name in zip(rule_lines(node, g.opset(node.domain)), node.input):
                if name:
                    where = "" if sym == name else f"  [{sym} = {name}]"
                    t.append(f"  {rule or f'd{sym}: no gradient'}{where}\n", style="dim")
        return t

    def _tensor_text(self, s, name: str) -> Text:
        g = s.graph
        info = g.types.get(name)
        t = Text()
        t.append(f"▸ {name}", style="bold")
        role = s.role_of(name)
        if role:
            t.append(f"  ({ROLE_NAMES[role]})", style="bold green")
        t.append("\n")
        if info is not None:
            from onnx import TensorProto

            dtype = TensorProto.DataType.Name(info.elem_type).lower() if info.elem_type else "?"
            shape = "?" if info.shape is None else "[" + ",".join(str(d) if d else "?" for d in info.shape) + "]"
            t.append(f"  {dtype} {shape}\n")
        kind = "initializer" if name in g.initializers else "graph input" if name in g.inputs else None
        if name in g.producer:
            t.append(f"  from {g.node_names[g.producer[name]]}\n", style="dim")
        elif kind:
            t.append(f"  {kind}\n", style="dim")
        users = [g.node_names[k] for k in g.consumers.get(name, [])]
        if users:
            more = f" +{len(users) - 4}" if len(users) > 4 else ""
            t.append(f"  to {', '.join(users[:4])}{more}\n", style="dim")
        source, explicit = s.feed_source(name)
        if source is not None:
            t.append(f"  feed: {source.describe()}{'' if explicit else ' (default)'}\n", style="cyan")
        value = s.values.get(name)
        blocked = s.model.blocked([name], list(s.feeds)) if value is None and s.model.unsupported_nodes() else {}
        if blocked:
            t.append(f"  no value: it needs {g.node_names[blocked[name]]}, an op onnxgrad cannot run\n", style="red")
        if value is not None and not isinstance(value, list):
            t.append_text(stats_text(value, "value"))
            t.append("\n")
            t.append_text(histogram(value))
            t.append("\n")
        elif value is None:
            t.append("  value: computing…\n", style="dim")
        flowing = getattr(s.gradient_stats, "tensors", {}).get(name) if s.gradient_stats else None
        if flowing is not None and (s.gradient is None or name not in s.gradient.grads):
            t.append(f"d{s.gradient.spec.y}/d{name} ", style="bold")
            t.append(f"{flowing.describe()}\n")
        if s.gradient is not None and name in s.gradient.grads:
            grad = s.gradient.grads[name]
            t.append_text(stats_text(grad, f"d{s.gradient.spec.y}/d{name}"))
            if name in s.gradient.disconnected:
                t.append("\n  disconnected: y does not depend on it", style="yellow")
            t.append("\n")
        return t


def _update(static: Static, content) -> None:
    """`static.update`, laying the screen out again only when the content's height changed: a
    layout per update was most of an arrow key's time on big models."""
    height, width = static.content_size.height, static.content_size.width
    static.update(content, layout=False)
    if not width or static.get_content_height(static.size, static.app.size, width) != height:
        static.refresh(layout=True)


def _check_status(s, node_name: str) -> str | None:
    report = s.check
    for n in getattr(report, "nodes", None) or ():
        if getattr(n, "node_name", None) == node_name:
            return str(getattr(n, "status", ""))
    return None
