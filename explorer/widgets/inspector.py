"""The inspector: what the cursor is on — node, tensor, values, gradient, a heatmap slice."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper
from rich.console import Group
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input

from ..guard import guarded
from ..rules import rule_lines
from .diff_view import diff_section
from .page import Page
from .visuals import heatmap, histogram, parse_slice, stats_text

ROLE_NAMES = {"x": "in xs", "z": "in zs", "y": "is y"}


@guarded
class Inspector(Widget, can_focus=True):
    # Tab can land in the slice box, where letters are text, not keys: escape hands them back.
    BINDINGS = [Binding("escape", "leave", "Back to the graph", show=False, id="inspector.leave"),
                Binding("up", "scroll(-1)", "Scroll up", show=False, id="inspector.scroll_up"),
                Binding("down", "scroll(1)", "Scroll down", show=False, id="inspector.scroll_down"),
                Binding("pageup", "page(-1)", "Page up", show=False, id="inspector.page_up"),
                Binding("pagedown", "page(1)", "Page down", show=False, id="inspector.page_down"),
                Binding("home", "scroll(-1000000)", "Top", show=False, id="inspector.top"),
                Binding("end", "scroll(1000000)", "Bottom", show=False, id="inspector.bottom")]
    DEFAULT_CSS = """
    Inspector { width: 50; border-left: solid $panel; padding: 0 0 0 1; layout: vertical; }
    Inspector > #inspector-slice { display: none; height: 3; }
    Inspector.-sliceable:focus-within > #inspector-slice { display: block; }
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
        yield Page(id="inspector-page")
        yield Input(placeholder="slice: leading indices, e.g. 0,1", id="inspector-slice")

    def show(self, session, node_index: int | None, tensor: str | None) -> None:
        moved = (node_index, tensor) != (self.node_index, self.tensor)
        if moved:
            self.lead, self.focus_element = (), None
        self.session, self.node_index, self.tensor = session, node_index, tensor
        self.refresh_content(keep_offset=not moved)

    @property
    def page(self) -> Page:
        return self.query_one(Page)

    def action_scroll(self, lines: int) -> None:
        self.page.scroll_lines(lines)

    def action_page(self, pages: int) -> None:
        self.page.scroll_lines(pages * max(1, self.page.size.height - 1))

    def on_focus(self) -> None:
        self.refresh_content()  # the slice box appears: the heatmap's hint to tab here goes

    on_blur = on_descendant_focus = on_descendant_blur = on_focus

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.page.scroll_lines(3)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.page.scroll_lines(-3)

    def point_at(self, index: tuple[int, ...]) -> None:
        """Show the slice holding element `index` with that element marked (jump to worst)."""
        self.focus_element = tuple(int(i) for i in index)
        self.lead = self.focus_element[:-2] if len(self.focus_element) > 2 else ()
        self.refresh_content()
        self.page.scroll_lines(1000000)  # the heatmap is last

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
    def refresh_content(self, keep_offset: bool = True) -> None:
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
        elif s.diff is not None:  # diff mode: the verdict and both sides' values first
            parts.insert(0, diff_section(s.diff, s.graph, self.node_index, self.tensor, s.diff.stale(s)))
        info = Group(*parts)
        arr = self._heat_array()
        self.has_heatmap = arr is not None and arr.size > 0
        if not self.has_heatmap:
            self.page.show(info, keep_offset=keep_offset)
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
        if arr.ndim > 2 and not self.has_focus_within:
            title.append("  tab here to slice", style="dim")
        self.page.show(Group(info, title, heatmap(arr, self.lead, focus)), keep_offset=keep_offset)

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
            summary = self._summary("value", name, value)
            if summary is None:
                t.append(f"  value: summarizing {np.size(value):,} elements…\n", style="dim")
            else:
                t.append_text(stats_text(summary, "value"))
                t.append("\n")
                t.append_text(histogram(summary))
                t.append("\n")
        elif value is None:
            t.append("  value: computing…\n", style="dim")
        flowing = getattr(s.gradient_stats, "tensors", {}).get(name) if s.gradient_stats else None
        if flowing is not None and (s.gradient is None or name not in s.gradient.grads):
            t.append(f"d{s.gradient.spec.y}/d{name} ", style="bold")
            t.append(f"{flowing.describe()}\n")
        if s.gradient is not None and name in s.gradient.grads:
            grad = s.gradient.grads[name]
            summary = self._summary("gradient", name, grad)
            label = f"d{s.gradient.spec.y}/d{name}"
            if summary is None:
                t.append(f"{label}: summarizing {np.size(grad):,} elements…", style="dim")
            else:
                t.append_text(stats_text(summary, label))
            if name in s.gradient.disconnected:
                t.append("\n  disconnected: y does not depend on it", style="yellow")
            t.append("\n")
        return t


    def _summary(self, kind: str, name: str, array):
        """The array's Summary, or None while a worker makes it (big arrays: see summaries.py)."""
        summary = self.session.summaries.summary(kind, name, array)
        if summary is None:
            self.post_message(self.SummaryWanted(kind, name, array))
        return summary

    @dataclass
    class SummaryWanted(Message):
        """The inspector shows a tensor too big to summarize while drawing: the app starts a worker."""

        kind: str  # "value" or "gradient"
        name: str
        array: object


def _check_status(s, node_name: str) -> str | None:
    report = s.check
    for n in getattr(report, "nodes", None) or ():
        if getattr(n, "node_name", None) == node_name:
            return str(getattr(n, "status", ""))
    return None
