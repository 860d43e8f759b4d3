"""Step mode (teaching): the forward pass with forward mode's tangents beside it, then reverse mode node
by node, each local rule written out."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..guard import guarded
from ..stepper import Frame, TensorView, Trace
from ..widgets.graph_view import GraphView


def _tensor_line(v: TensorView, label: str = "") -> Text:
    t = Text("  ")
    t.append(label or v.name, style="bold")
    t.append(f"  {'×'.join(map(str, v.shape)) or 'scalar'} {v.dtype}", style="dim")
    if v.norm is not None:
        t.append(f"  norm {v.norm:.4g}")
    t.append(f"  {v.preview}", style="cyan")
    return t


def describe(frame: Frame, k: int, trace: Trace) -> Group:
    """The text of one frame: what came in, the rule, what went out and where it added up."""
    n_fwd = trace.forward_count
    n_rev = len(trace.frames) - n_fwd if trace.complete else "…"  # not known until the pass is traced
    pos = f"{k + 1}/{n_fwd}" if frame.phase == "forward" else f"{k - n_fwd + 1}/{n_rev}"
    head = Text.assemble((f"{frame.phase.upper()} {pos}  ", "bold reverse"), " ",
                         (frame.node_name, "bold"), f"  ({frame.op_type})")
    parts = [head]
    if frame.phase == "forward":
        parts.append(Text("inputs", style="bold underline"))
        parts += [_tensor_line(trace.view(t)) for t in frame.inputs]
        parts.append(Text("outputs", style="bold underline"))
        parts += [_tensor_line(trace.view(t)) for t in frame.outputs]
        parts += _forward_mode(frame, trace)
        if k == n_fwd - 1:
            mode = trace.forward_mode
            if mode is not None and mode.jvp is not None:
                parts.append(Text(f"\nForward mode done: J·v of {trace.spec.y} along v, in the same one pass.",
                                  style="italic green"))
            parts.append(Text(f"\ny = {trace.spec.y} computed. Next: the reverse pass starts with "
                              f"d{trace.spec.y} = ones (the seed).", style="italic"))
        return Group(*parts)
    parts.append(Text("incoming gradient", style="bold underline"))
    parts += [_tensor_line(TensorView.of("d" + t, g)) for t, g in frame.incoming]
    parts.append(Text("local rule (one line per input)", style="bold underline"))
    for o in frame.outgoing:
        rule = o.rule or f"d{o.symbol}: no gradient for this input"
        parts.append(Text.assemble("  ", (rule, "yellow"), (f"    [{o.symbol} = {o.tensor}]", "dim")))
    parts.append(Text("outgoing gradients", style="bold underline"))
    for o in frame.outgoing:
        if o.contribution is None:
            parts.append(Text(f"  d{o.tensor}: {o.note}", style="dim"))
            continue
        parts.append(_tensor_line(TensorView.of("d" + o.tensor, o.contribution)))
        if o.note:
            parts.append(Text(f"    ↳ {o.note}", style="magenta"))
    if trace.complete and k == len(trace.frames) - 1:
        done = ", ".join(f"d{trace.spec.y}/d{x}" for x in trace.spec.xs)
        parts.append(Text(f"\nDone: {done} accumulated: what r (run) gets from one autograd call.",
                          style="italic green"))
        sums = trace.forward_mode.identity(trace.grads) if trace.forward_mode is not None else None
        if sums is not None:
            parts.append(Text(f"The two modes are transposes: ⟨ones, J·v⟩ = {sums[0]:.6g} (forward) and "
                              f"Σₓ ⟨d{trace.spec.y}/dx, v⟩ = {sums[1]:.6g} (reverse).", style="italic green"))
    return Group(*parts)


def _forward_mode(frame: Frame, trace: Trace) -> list:
    """Forward mode beside a forward frame: the tangents that arrive and the one the node pushes on."""
    mode = trace.forward_mode
    if mode is None:
        return []
    if mode.failure is not None:
        return [Text("forward mode (tangents along v)", style="bold underline"),
                Text(f"  not available: {mode.failure}", style="dim")]
    if not frame.tangents_in:
        return []
    parts = [Text("forward mode (tangents along v)", style="bold underline")]
    parts += [_tensor_line(TensorView.of("ṫ " + t, v)) for t, v in frame.tangents_in]
    for t, _ in frame.tangents_out:
        terms = " + ".join(f"∂{t}/∂{i}·ṫ {i}" for i, _ in frame.tangents_in)
        parts.append(Text.assemble("  ", (f"ṫ {t} = {terms}", "yellow"), ("    [the node's JVP]", "dim")))
    parts += [_tensor_line(TensorView.of("ṫ " + t, v)) for t, v in frame.tangents_out]
    return parts


@guarded
class StepScreen(Screen):
    # Priority: the graph and the details pane bind the arrows, home and end for themselves, and
    # step mode promises (header, help, docs) that they step.
    BINDINGS = [
        Binding("right,n,space", "step(1)", "Next", id="step.next", priority=True),
        Binding("left,p", "step(-1)", "Back", id="step.back", priority=True),
        Binding("home", "jump(0)", "First", id="step.first", priority=True),
        Binding("end", "jump(-1)", "Last", id="step.last", priority=True),
        Binding("escape,q", "close", "Close", id="step.close"),
        Binding("shift+up", "pan(0, -4)", "Pan up", show=False, id="step.pan_up"),
        Binding("shift+down", "pan(0, 4)", "Pan down", show=False, id="step.pan_down"),
        Binding("shift+left", "pan(-8, 0)", "Pan left", show=False, id="step.pan_left"),
        Binding("shift+right", "pan(8, 0)", "Pan right", show=False, id="step.pan_right"),
    ]
    HEADER = "→ n space next · ← p back · home end first/last · ↑↓ scroll · shift+arrows pan · esc close"
    DEFAULT_CSS = """
    StepScreen GraphView { width: 1fr; }
    StepScreen #step-details { width: 1fr; min-width: 36; max-width: 72; border-left: solid $panel; padding: 0 1; }
    StepScreen #step-title { height: auto; background: $panel; padding: 0 1; }
    """

    def __init__(self, trace: Trace, layout, total: int = 0, canvas=None, shown=None):
        """`trace` may hold only the first frames: `add_frames` brings the others as they are
        traced, `total` being the number of nodes each pass visits."""
        super().__init__()
        self.trace = trace
        self.graph_layout = layout
        self.canvas = canvas  # the main view's drawing of `layout`, if it has one
        self.shown = shown  # threading.Event the tracing thread waits on: set once this screen is drawn
        self.position = 0
        self.at_end = False  # End pressed before the trace was complete: the last frame, once known
        self.traced = (total if trace.complete else 0, total)  # reverse-pass nodes visited, of
        self.failure: str | None = None  # why the reverse pass stopped, if it failed

    def compose(self) -> ComposeResult:
        yield Static(id="step-title")
        with Horizontal():
            graph = GraphView(id="step-graph")
            graph.can_focus = False  # the keys step; the details pane scrolls with up/down
            yield graph
            with VerticalScroll(id="step-details"):
                yield Static(id="step-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(GraphView).set_layout(self.graph_layout, "no layout", self.canvas)
        self._show()
        if self.shown is not None:
            self.call_after_refresh(self.shown.set)

    def on_unmount(self) -> None:
        if self.shown is not None:
            self.shown.set()

    @property
    def frame(self) -> Frame | None:
        """The frame on screen; None while it is still being traced."""
        frames = self.trace.frames
        return frames[self.position] if self.position < len(frames) and not self.at_end else None

    @property
    def waiting(self) -> bool:
        return not self.trace.complete and self.failure is None

    def _last_position(self) -> int:
        if not self.waiting:
            return len(self.trace.frames) - 1
        return self.trace.forward_count + self.traced[1] - 1  # at most one reverse frame per node

    def add_frames(self, frames, done: int, total: int, grads=None) -> None:
        """Reverse frames from the tracing worker; the last chunk brings the accumulated gradients."""
        shown = self.frame is not None
        self.trace = self.trace.extended(frames, grads)
        self.traced = (done, total)
        if self.trace.complete:
            if self.at_end:
                self.position, self.at_end = len(self.trace.frames) - 1, False
            self.position = max(0, min(self.position, len(self.trace.frames) - 1))
        # A frame on screen stays as it is until the pass ends (its position reads "k/…" until then).
        if self.is_mounted and (not shown or self.trace.complete):
            self._show()

    def trace_failed(self, reason: str) -> None:
        self.failure = reason
        self.at_end = False
        self.position = max(0, min(self.position, len(self.trace.frames) - 1))
        if self.is_mounted:
            self._show()

    def action_step(self, delta: int) -> None:
        if self.at_end:  # waiting for the last frame: step from the first frame not traced yet
            self.position, self.at_end = len(self.trace.frames), False
        self.position = max(0, min(self._last_position(), self.position + delta))
        self._show()

    def action_pan(self, dx: int, dy: int) -> None:
        self.query_one(GraphView).action_pan(dx, dy)

    def action_jump(self, where: int) -> None:
        self.at_end = where == -1 and self.waiting
        self.position = where % max(1, len(self.trace.frames))
        self._show()

    def action_close(self) -> None:
        self.dismiss(self.frame.node_index if self.frame else None)

    def _show(self) -> None:
        title = self.query_one("#step-title", Static)
        text = self.query_one("#step-text", Static)
        frame = self.frame
        if not self.trace.frames:
            title.update("Step mode: nothing to step through")
            text.update("The selection has no nodes between xs and y.")
            return
        title.update(Text.assemble(("Step mode ", "bold"), f"y {self.trace.spec.y}  xs "
                                   f"{', '.join(self.trace.spec.xs)}   ", (self.HEADER, "dim")))
        if frame is None:
            n_fwd, have = self.trace.forward_count, len(self.trace.frames)
            done, total = (have, n_fwd) if have < n_fwd else self.traced
            which = "the last frame" if self.at_end else (
                f"forward frame {self.position + 1}" if self.position < n_fwd
                else f"reverse frame {self.position - n_fwd + 1}")
            text.update(Text(f"tracing {'forward' if have < n_fwd else 'reverse'} pass {done}/{total}…\n"
                             f"{which} is shown as soon as it is traced (← p back, esc close).", style="italic"))
            return
        body = describe(frame, self.position, self.trace)
        if self.failure is not None and self.position == len(self.trace.frames) - 1:
            body = Group(body, Text(f"\nThe reverse pass stopped here: {self.failure}", style="bold red"))
        text.update(body)
        graph = self.query_one(GraphView)
        ids = graph.ids_for(node_index=frame.node_index)
        done = {f.node_index for f in self.trace.frames[:self.position]
                if f.phase == frame.phase}
        marks = {}
        for n in self.graph_layout.nodes if self.graph_layout is not None else ():
            if n.node_index in done:
                marks[n.id] = "pass"
        for i in ids:
            marks[i] = "current"
        graph.set_marks(marks)
        if ids:
            graph.select(ids[0])
