"""The explorer App and `make_app`, the one factory shared by the console script, snapshots and tests."""
from __future__ import annotations

import gc

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input

import engine
from engine.errors import OnnxGradError

from . import messages as m
from .commands import ExplorerCommands, PaletteApp
from .debugging import Debugging
from .foreground import Foreground
from .graph_work import LayoutWork
from .guard import guarded
from .layout import wants_local
from .marks import graph_marks
from .screens.feed import CLEAR, FeedScreen
from .screens.help import HelpScreen
from .screens.prompt import PromptScreen
from .screens.step import StepScreen
from .selecting import Selecting
from .state import Session, available_devices, open_session
from .widgets.footer import FittingFooter
from .widgets.graph_view import GraphView
from .widgets.inspector import Inspector
from .widgets.node_list import NodeList
from .widgets.results import Results
from .widgets.selection_bar import SelectionBar
from .widgets.status import StatusLine
from .work import CANCELLABLE, Workers

COLLECT_EVERY_S = 1.0  # how often the garbage collector may run (explorer/foreground.py)
AFTER_INPUT_S = 0.02  # how often work put off by after_input looks again


@guarded
class ExplorerApp(Selecting, Debugging, LayoutWork, Workers, PaletteApp, App):
    TITLE = "onnxgrad"
    CSS_PATH = "explorer.tcss"
    COMMANDS = App.COMMANDS | {ExplorerCommands}
    SELECT = Binding.Group("Select")
    SETTINGS = Binding.Group("View·dtype")
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("slash", "search", "Find", key_display="/", id="app.search", priority=True),  # see NodeList
        Binding("y", "set_y", "Set y", id="selection.set_y", group=SELECT),
        Binding("x", "toggle_x", "Add/remove in xs", id="selection.toggle_x", group=SELECT),
        Binding("z", "toggle_z", "Add/remove in zs", id="selection.toggle_z", group=SELECT),
        Binding("i", "zs_inputs", "Inputs to zs", id="selection.zs_inputs", group=SELECT,
                tooltip="Put every graph input the selection still needs into zs"),
        Binding("c", "clear_selection", "Clear the selection", id="selection.clear", group=SELECT),
        Binding("o", "next_tensor", "Next", id="cursor.next_tensor",
                tooltip="Next tensor of this node (outputs, then inputs); from an input or weight, its reader"),
        Binding("f", "feed", "Feed", id="feed.open"),
        Binding("r", "run", "Run", id="work.run"),
        Binding("v", "verify", "Verify", id="work.verify"),
        Binding("s", "step", "Step", id="work.step"),
        Binding("e", "export", "Export", id="work.export"),
        Binding("n", "go_to_culprit", "Culprit", id="results.culprit",
                tooltip="Go to the first failing node, or to where NaN/Inf starts"),
        Binding("g", "cycle_view", "View: forward/backward/combined", id="view.cycle", group=SETTINGS),
        Binding("d", "cycle_device", "Device: cpu/cuda", id="settings.device", group=SETTINGS),
        Binding("t", "toggle_dtype", "Dtype: float32/float64", id="settings.dtype", group=SETTINGS),
        Binding("D", "set_dims", "Dims", id="settings.dims", group=SETTINGS,
                tooltip="Sizes of the symbolic dims (batch, seq) for the values made up for unfed inputs"),
        Binding("h", "heat_source", "Heat", id="inspector.heat_source",
                tooltip="Heatmap shows the value / the gradient"),
        Binding("escape", "cancel", "Cancel", id="work.cancel"),
    ]

    def __init__(self, session: Session | None, load_error: str | None = None, placement: str = "auto"):
        super().__init__()
        self.session = session
        self.load_error = load_error
        self.placement = placement  # graph layout: "auto", "dot" or "layered" (see layout.py)
        self.cursor: tuple[int | None, str | None] = (None, None)
        self.layouts: dict[tuple, object] = {}
        self.collect_before_freeze = False  # set when a model replaces another (see open_session)
        self.foreground = Foreground()  # opened on mount, closed on unmount
        self.put_off = 0  # callbacks after_input holds back: what a settled app (a test) waits for too

    def on_unmount(self) -> None:
        self.foreground.close()

    async def on_event(self, event: events.Event) -> None:
        # Keys, clicks and wheel turns, not pointer moves: background work waits while they are
        # answered (explorer/foreground.py): until the frame after the action they ran, or at most
        # foreground.HOLD_S (input that runs no action).
        if isinstance(event, (events.Key, events.MouseDown, events.MouseScrollUp, events.MouseScrollDown)) \
                and not event.is_forwarded:
            self.foreground.begin()
        await super().on_event(event)

    async def run_action(self, action, default_namespace=None, namespaces=None) -> bool:
        try:
            return await super().run_action(action, default_namespace, namespaces)
        finally:
            if self.foreground.busy:
                # A widget's action posts its news (a cursor move) to itself, bubbling up to here.
                target = default_namespace if isinstance(default_namespace, Widget) else self
                target.post_message(m.InputAnswered())

    def on_input_answered(self, message: m.InputAnswered) -> None:
        self.call_after_refresh(self.foreground.end)  # what the action changed is dirty: after its frame

    def after_input(self, callback) -> None:
        """`callback()` now, or once the input being answered is drawn: one-time work a worker hands
        over (a listing, the whole layout: 10-30 ms of this thread on GPT-2 large) would otherwise
        land inside that key's frame."""
        if self.foreground.busy:
            self.put_off_for(self, AFTER_INPUT_S, lambda: self.after_input(callback))
        else:
            callback()

    def put_off_for(self, owner: Widget | App, delay: float, callback) -> None:
        """`callback()` after `delay` s, on `owner`'s timer, counted in `put_off` until then: work
        waiting for a timer is still under way, for whoever waits for the app to settle (a test)."""
        self.put_off += 1

        def run():
            self.put_off -= 1
            callback()
        owner.set_timer(delay, run)

    def get_default_screen(self) -> Screen:
        # Textual focuses the first focusable widget when a screen shows: here the navigator's search
        # box, after open_session focused the graph when the model loaded first, so y, x, z and r
        # were typed into the search. Dialogs and step mode keep the default.
        screen = super().get_default_screen()
        screen.AUTO_FOCUS = "#graph"
        return screen

    def check_action(self, action: str, parameters) -> bool | None:
        """Keys that mean nothing right now leave the footer (they still work from ctrl+p when they can)."""
        s = self.session
        if len(self.screen_stack) > 1:
            # Step mode and dialogs own the keys while they are open: the main screen's keys stay off
            # behind them, Textual's own (tab and shift+tab between fields, ctrl+p, ctrl+q) stay on.
            return action == "quit" or action not in MAIN_ACTIONS
        if s is None:
            return action in ("quit", "help", "open_model", "command_palette") or None
        if action == "search":  # a "/" typed into a text field is a character
            return not isinstance(self.focused, Input)
        if action == "cancel":
            return any(w.group in CANCELLABLE and w.is_running for w in self.workers)
        if action == "next_tensor":  # on a lone tensor it steps onto the node reading it
            return self.cursor[1] is not None
        if action == "clear_selection":
            return bool(s.y or s.xs or s.zs)
        if action == "zs_inputs":
            return bool(s.missing_inputs)
        if action == "set_dims":
            return bool(s.dims_text())
        if action == "go_to_culprit":
            return self.culprit() is not None
        if action == "cycle_device":
            return len(available_devices()) > 1
        if action == "heat_source":
            # On any tensor, not only once its heatmap is drawn: a key that came and went with each
            # value made the footer recompose twice per arrow press on big models.
            return self.cursor[1] is not None
        return True

    _footer_state: tuple = ()

    def refresh_footer(self, force: bool = False) -> None:
        """Announce the bindings only when a key appears, leaves or turns dim.

        `force` when work starts or ends: Textual also refreshes bindings by itself (a dialog
        closing), so the state cached here can be stale exactly then.
        """
        state = tuple(self.check_action(b.action, ()) for b in self.BINDINGS)
        if force or state != self._footer_state:
            self._footer_state = state
            # The main screen's footer, even while a dialog that is closing is still on top.
            self.screen_stack[0].refresh_bindings()

    def compose(self) -> ComposeResult:
        yield SelectionBar(id="selection-bar")
        with Horizontal(id="main"):
            yield NodeList(id="node-list")
            yield GraphView(id="graph")
            yield Inspector(id="inspector")
        yield Results(id="results")
        yield StatusLine(id="status")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.foreground.open()
        self.set_interval(COLLECT_EVERY_S, self.foreground.collect)
        if self.load_error:
            self.notify(self.load_error, title="cannot open the model", severity="error", timeout=30)
        if self.session is None:
            self.query_one(GraphView).set_layout(None, "no model: ctrl+p → Open model…")
            return
        self.open_session(self.session)

    def open_session(self, session: Session) -> None:
        replacing = self.session is not None and self.session is not session
        self.session, self.layouts, self.local = session, {}, None
        if replacing:
            # What was frozen for the last model is collectable again; the next layout collects
            # it, once the widgets have let go of it, then freezes the new model (graph_work.py).
            gc.unfreeze()
            self.collect_before_freeze = True
        else:
            # The loaded model lives as long as the session: out of the cyclic collector's way, or
            # its full passes over the model's objects stall the first paint.
            gc.freeze()
        self.sub_title = session.label
        self.query_one(NodeList).set_graph(session.graph, frozenset(session.model.unsupported_nodes()),
                                           later=wants_local(session.model))
        graph = self.query_one(GraphView)
        graph.set_layout(None, "laying out the graph…")
        graph.focus()
        g = session.graph
        first = (None, g.inputs[0]) if g.inputs else ((0, _first_output(g, 0)) if g.nodes else (None, None))
        self.move_cursor(*first, announce=True)
        self.selection_changed()
        self.request_layout(first=True)
        if summary := session.model.unsupported_summary():
            self.notify(summary, title="unsupported ops", severity="warning", timeout=20)

    # --- cursor --------------------------------------------------------------------------------
    def move_cursor(self, node_index: int | None, tensor: str | None, origin: str = "", announce: bool = True) -> None:
        if self.session is None or (node_index, tensor) == self.cursor:
            return
        if node_index is not None and tensor is None:
            tensor = _first_output(self.session.graph, node_index)
        self.cursor = (node_index, tensor)
        if origin != "graph":
            self._show_in_graph(node_index, tensor)
        if origin != "list":
            self.query_one(NodeList).highlight(node_index, tensor)
        self.query_one(Inspector).show(self.session, node_index, tensor)
        if tensor is not None:
            self.request_values([tensor])
        self.refresh_footer()
        if announce:
            self.post_message(m.CursorMoved(node_index, tensor))

    def _show_in_graph(self, node_index: int | None, tensor: str | None) -> None:
        """Select the box of the node, else of the tensor, else of the node producing the tensor;
        none where the view draws none of them (a box left selected would name another node)."""
        self.follow_local(node_index, tensor)
        if ids := self.boxes_for(node_index, tensor):
            self.query_one(GraphView).select(ids[0])
        else:
            self.query_one(GraphView).deselect()

    def on_graph_view_node_chosen(self, event: GraphView.NodeChosen) -> None:
        event.graph_view.select(event.box, scroll=event.scroll)
        self.move_cursor(event.node_index, event.tensor, origin="graph")
        self.follow_local(event.node_index, event.tensor)

    def on_node_list_picked(self, event: NodeList.Picked) -> None:
        self.query_one(NodeList).show_entry(event)
        self.move_cursor(event.node_index, event.tensor, origin="list")
        if event.jump:
            self.query_one(GraphView).focus()

    def action_next_tensor(self) -> None:
        node, tensor = self.cursor
        if node is None:  # a graph input or weight: onto the first node reading it
            readers = self.session.graph.consumers.get(tensor, [])
            if readers:
                self.move_cursor(readers[0], tensor)
            else:
                self.notify(f"no node reads {tensor}", severity="warning", timeout=3)
            return
        n = self.session.graph.nodes[node]
        names = [t for t in list(n.output) + list(n.input) if t]
        k = names.index(tensor) + 1 if tensor in names else 0
        self.cursor = (node, names[k % len(names)])
        self.query_one(Inspector).show(self.session, *self.cursor)
        self.request_values([self.cursor[1]])
        self.post_message(m.CursorMoved(*self.cursor))

    def results_changed(self) -> None:
        """Redraw everything that shows the session: bar, marks, inspector, tables."""
        s = self.session
        self.query_one(SelectionBar).show(s)
        graph = self.query_one(GraphView)
        graph.set_marks(graph_marks(s, graph.canvas.layout if graph.canvas else None))
        self.query_one(Inspector).show(s, *self.cursor)
        results = self.query_one(Results)
        results.show_gradient(s.gradient, s.gradient_origin, s.gradient_summary)
        results.show_check(s.check)
        self.refresh_footer()

    # --- feeds, settings, views ---------------------------------------------------------------------
    def action_feed(self) -> None:
        tensor = self._tensor_or_warn()
        if tensor is None:
            return
        source, explicit = self.session.feed_source(tensor)

        def try_feed(src) -> str | None:
            try:
                self.session.set_feed(tensor, src)
            except OnnxGradError as exc:
                return str(exc)
            return None

        def done(result) -> None:
            if result is None:
                return
            if result == CLEAR:
                self.session.clear_feed(tensor)
            self.results_changed()
            self.request_values([tensor])
            desc = None if result == CLEAR else result.describe()
            self.post_message(m.FeedChanged(tensor, desc))
            self.notify(f"{tensor}: {desc or 'feed removed'}", timeout=3)

        g = self.session.graph
        unfed = (f"computed by {g.node_names[g.producer[tensor]]}" if tensor in g.producer
                 else "its initializer" if tensor in g.initializers else "not fed")
        self.push_screen(FeedScreen(tensor, source, explicit, try_feed, unfed), done)

    def _settings_changed(self) -> None:
        s = self.session
        self.results_changed()
        self.request_values([self.cursor[1]] if self.cursor[1] else [])
        self.post_message(m.SettingsChanged(s.device, s.dtype, s.view))

    def action_cycle_device(self) -> None:
        self.notify(f"device: {self.session.cycle_device()}", timeout=2)
        self._settings_changed()

    def action_toggle_dtype(self) -> None:
        self.notify(f"dtype: {self.session.toggle_dtype()}", timeout=2)
        self._settings_changed()

    def action_cycle_view(self) -> None:
        self.session.cycle_view()
        self.request_layout()
        self._settings_changed()

    def action_heat_source(self) -> None:
        self.notify(f"heatmap shows the {self.query_one(Inspector).toggle_heat_source()}", timeout=2)

    def action_search(self) -> None:
        self.query_one(NodeList).open_search()

    def action_help(self) -> None:
        groups = [("explorer", list(self.BINDINGS)), ("graph", list(GraphView.BINDINGS)),
                  ("inspector", list(Inspector.BINDINGS)), ("step mode", list(StepScreen.BINDINGS))]
        self.push_screen(HelpScreen(groups))

    def action_open_model(self) -> None:
        self.push_screen(PromptScreen("Open an ONNX model (path):", placeholder="model.onnx"),
                         lambda path: path and self.run_open(path))

    def on_model_opened(self, message: m.ModelOpened) -> None:
        old = self.session
        session = Session(message.model, message.label, seed=old.seed if old else 0)
        self.open_session(session)
        self.notify(f"opened {message.label}", timeout=3)


MAIN_ACTIONS = frozenset(b.action.split("(")[0] for b in ExplorerApp.BINDINGS)


def _first_output(graph, i: int) -> str | None:
    return next((t for t in graph.nodes[i].output if t), None)


def make_app(model_path: str | None = None, *, model: engine.Model | None = None, label: str | None = None,
             seed: int = 0, device: str = "cpu", dtype: str = "float32", select_from_gradient_node: bool = True,
             placement: str = "auto", ops: tuple[str, ...] = (), dims: dict[str, int] | None = None) -> ExplorerApp:
    """The explorer on a path, a loaded Model, or (neither) the bundled spec example.

    A model that fails to load still opens the app, which shows the one-line reason.
    `placement="layered"` makes the drawing independent of the installed Graphviz (snapshots).
    `ops`: Python files that register ops (`--ops`), imported before the model is loaded.
    `dims`: sizes of the model's symbolic dims (`--dim`), as the dims dialog sets them.
    """
    session, load_error = open_session(model_path, model=model, label=label, seed=seed, device=device, dtype=dtype,
                                       ops=ops, dims=dict(dims or {}))
    if session is not None and select_from_gradient_node:
        session.select_from_gradient_node()
    return ExplorerApp(session, load_error, placement)
