"""The explorer App and `make_app`, the one factory shared by the console script, snapshots and tests.

The App composes the screen and holds every key's action and every message handler; each hands its work to a
collaborator (selection, settings, navigation, layouts, work, stepping, debugging, diffing, keys, pacing), which names
what it uses of the App in a Protocol and is tested without one (tests/explorer/test_collaborators.py). They share
`Shown` (host.py): the session and the cursor.
"""
from __future__ import annotations

from textual import events
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widget import Widget

import engine

from . import commands as palette
from . import messages as m
from .bindings import APP_BINDINGS
from .commands import ExplorerCommands
from .debugging import Debugging
from .diffing import Diffing
from .foreground import Foreground
from .graph_work import LayoutWork
from .guard import guarded
from .host import Shown
from .keys import Keys
from .layout import wants_local
from .marks import graph_marks
from .navigation import Navigation, first_output
from .pacing import Pacing
from .screens.help import HelpScreen
from .screens.prompt import PromptScreen
from .screens.step import StepScreen
from .selecting import Selection
from .settings import Settings
from .state import Session, open_session
from .stepping import Stepping
from .widgets.footer import FittingFooter
from .widgets.graph_view import GraphView
from .widgets.inspector import Inspector
from .widgets.node_list import NodeList
from .widgets.results import Results
from .widgets.selection_bar import SelectionBar
from .widgets.status import StatusLine
from .work import Work, live

COLLECT_EVERY_S = 1.0  # how often the garbage collector may run (explorer/foreground.py)


@guarded
class ExplorerApp(App):
    TITLE = "onnxgrad"
    CSS_PATH = "explorer.tcss"
    COMMANDS = App.COMMANDS | {ExplorerCommands}
    BINDINGS = APP_BINDINGS

    def __init__(self, session: Session | None, load_error: str | None = None, placement: str = "auto"):
        super().__init__()
        self.shown = Shown(session)
        self.load_error = load_error
        self.foreground = Foreground()  # opened on mount, closed on unmount
        self.pacing = Pacing(self.foreground)
        self.selection = Selection(self.shown, self.notify, self.selection_changed)
        self.settings = Settings(self.shown, self)
        self.layout_work = LayoutWork(self.shown, self, placement)
        self.navigation = Navigation(self.shown, self, self.layout_work)
        self.work = Work(self.shown, self)
        self.stepping = Stepping(self.shown, self, lambda: self.layout_work.layouts.get(("forward", None)))
        self.diffing = Diffing(self.shown, self)
        self.debugging = Debugging(self.shown, self, self.diffing)
        self.keys = Keys(self.shown, self, self.BINDINGS, self.work.cancellable, self.debugging.culprit)

    # --- the keys: each binding's action ------------------------------------------------------------
    async def action_quit(self) -> None:
        """Textual's own, named here beside the binding."""
        await super().action_quit()

    def action_help(self) -> None:
        groups = [("explorer", list(self.BINDINGS)), ("graph", list(GraphView.BINDINGS)),
                  ("inspector", list(Inspector.BINDINGS)), ("step mode", list(StepScreen.BINDINGS))]
        self.push_screen(HelpScreen(groups))

    def action_search(self) -> None:
        self.query_one(NodeList).open_search()

    def action_set_y(self) -> None:
        self.selection.set_y()

    def action_toggle_x(self) -> None:
        self.selection.toggle_x()

    def action_toggle_z(self) -> None:
        self.selection.toggle_z()

    def action_zs_inputs(self) -> None:
        self.selection.zs_inputs()

    def action_clear_selection(self) -> None:
        self.selection.clear()

    def action_next_tensor(self) -> None:
        self.navigation.next_tensor()

    def action_feed(self) -> None:
        self.settings.feed()

    def action_run(self) -> None:
        self.work.run()

    def action_verify(self) -> None:
        self.work.verify()

    def action_step(self) -> None:
        self.stepping.step()

    def action_export(self, what: str = "gradients") -> None:
        self.work.export(what)

    def action_go_to_culprit(self) -> None:
        self.debugging.go_to_culprit()

    def action_diff(self, what: str = "open") -> None:
        self.diffing.act(what)

    def action_cycle_view(self) -> None:
        self.settings.cycle_view()

    def action_cycle_device(self) -> None:
        self.settings.cycle_device()

    def action_toggle_dtype(self) -> None:
        self.settings.toggle_dtype()

    def action_set_dims(self) -> None:
        self.settings.set_dims()

    def action_heat_source(self) -> None:
        self.notify(f"heatmap shows the {self.query_one(Inspector).toggle_heat_source()}", timeout=2)

    def action_cancel(self) -> None:
        self.work.cancel()

    # --- the palette's own actions: every palette the app opens is a commands.Palette -------------------
    def action_open_model(self) -> None:
        self.push_screen(PromptScreen("Open an ONNX model (path):", placeholder="model.onnx"),
                         lambda path: path and self.run_open(path))

    def action_command_palette(self) -> None:
        palette.open_palette(self)

    def search_commands(self, commands, placeholder: str = "Search for commands…"):
        return palette.search_commands(self, commands, placeholder)

    def search_themes(self) -> None:
        palette.search_themes(self)

    def check_action(self, action: str, parameters) -> bool | None:
        """Keys that mean nothing right now leave the footer (they still work from ctrl+p when they can)."""
        return self.keys.applies(action, parameters)

    def refresh_footer(self, force: bool = False) -> None:
        self.keys.refresh(force)

    # --- the screen -------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield SelectionBar(id="selection-bar")
        with Horizontal(id="main"):
            yield NodeList(id="node-list")
            yield GraphView(id="graph")
            yield Inspector(id="inspector")
        yield Results(id="results")
        yield StatusLine(id="status")
        yield FittingFooter()

    def get_default_screen(self) -> Screen:
        # Textual focuses the first focusable widget when a screen shows: here the navigator's search
        # box, after open_session focused the graph when the model loaded first, so y, x, z and r
        # were typed into the search. Dialogs and step mode keep the default.
        screen = super().get_default_screen()
        screen.AUTO_FOCUS = "#graph"
        return screen

    def on_mount(self) -> None:
        self.foreground.open()
        self.set_interval(COLLECT_EVERY_S, self.foreground.collect)
        if self.load_error:
            self.notify(self.load_error, title="cannot open the model", severity="error", timeout=30)
        if self.session is None:
            self.query_one(GraphView).set_layout(None, "no model: ctrl+p → Open model…")
            return
        self.open_session(self.session)

    def on_unmount(self) -> None:
        self.foreground.close()

    def open_session(self, session: Session) -> None:
        replacing = self.session is not None and self.session is not session
        self.shown.session = session
        self.layout_work.new_model(replacing)
        self.sub_title = session.label
        self.query_one(NodeList).set_graph(session.graph, frozenset(session.model.unsupported_nodes()),
                                           later=wants_local(session.model))
        graph = self.query_one(GraphView)
        graph.set_layout(None, "laying out the graph…")
        graph.focus()
        g = session.graph
        first = (None, g.inputs[0]) if g.inputs else ((0, first_output(g, 0)) if g.nodes else (None, None))
        self.move_cursor(*first, announce=True)
        self.selection_changed()
        self.request_layout(first=True)
        if summary := session.model.unsupported_summary():
            self.notify(summary, title="unsupported ops", severity="warning", timeout=20)

    def on_model_opened(self, message: m.ModelOpened) -> None:
        old = self.session
        self.open_session(Session(message.model, message.label, seed=old.seed if old else 0))
        self.notify(f"opened {message.label}", timeout=3)

    # --- what the collaborators ask of each other through the App --------------------------------------
    session = property(lambda self: self.shown.session)
    cursor = property(lambda self: self.shown.cursor)
    put_off = property(lambda self: self.pacing.put_off)
    # read by tests, benchmarks/ and measure.py
    layouts = property(lambda self: self.layout_work.layouts)
    local = property(lambda self: self.layout_work.local)
    _values_timer = property(lambda self: self.work.values_timer)

    def move_cursor(self, node_index: int | None, tensor: str | None, origin: str = "", announce: bool = True) -> None:
        self.navigation.move(node_index, tensor, origin, announce)

    def selection_changed(self) -> None:
        s = self.session
        self.results_changed()
        if s.view != "forward":
            self.request_layout()
        self.post_message(m.SelectionChanged(s.y, s.xs, s.zs, s.selection_error))

    def results_changed(self) -> None:
        """Redraw everything that shows the session: bar, marks, inspector, tables."""
        s = self.session
        self.query_one(SelectionBar).show(s)
        graph = self.query_one(GraphView)
        graph.set_marks(graph_marks(s, graph.canvas.layout if graph.canvas else None))
        self.query_one(Inspector).show(s, *self.cursor)
        self.query_one(Results).show_session(s)
        self.query_one(NodeList).set_marks(s.diff.node_marks(s.graph) if s.diff is not None else {})  # diff mode
        self.refresh_footer()

    def request_values(self, names) -> None:
        self.work.request_values(names)

    def request_layout(self, first: bool = False) -> None:
        self.layout_work.request(first)

    def go_to_culprit(self, quiet: bool = False) -> None:
        self.debugging.go_to_culprit(quiet)

    def run_check(self, job):
        return self.work.run_check(job)

    def start_export(self, what: str, path: str) -> None:
        self.work.start_export(what, path)

    def run_open(self, path: str):
        return self.work.run_open(path)

    def boxes_for(self, node_index: int | None, tensor: str | None) -> list[str]:
        return self.layout_work.boxes_for(node_index, tensor)

    def _layout_key(self) -> tuple:
        return self.layout_work.key()

    def _work_live(self, group: str) -> bool:
        return live(self, group)

    # --- input first (explorer/foreground.py) -------------------------------------------------------------
    async def on_event(self, event: events.Event) -> None:
        self.pacing.saw(event)
        await super().on_event(event)

    async def run_action(self, action, default_namespace=None, namespaces=None) -> bool:
        try:
            return await super().run_action(action, default_namespace, namespaces)
        finally:
            # A widget's action posts its news (a cursor move) to itself, bubbling up to here.
            self.pacing.action_ran(default_namespace if isinstance(default_namespace, Widget) else self)

    def on_input_answered(self, message: m.InputAnswered) -> None:
        self.call_after_refresh(self.foreground.end)  # what the action changed is dirty: after its frame

    def after_input(self, callback) -> None:
        self.pacing.after_input(self, callback)

    def put_off_for(self, owner: Widget | App, delay: float, callback) -> None:
        self.pacing.put_off_for(owner, delay, callback)

    # --- message handlers: Textual calls them on the App; each hands the message on ---------------------
    def on_graph_view_node_chosen(self, event: GraphView.NodeChosen) -> None:
        self.navigation.chosen_in_graph(event.graph_view, event.node_index, event.tensor, event.box, event.scroll)

    def on_node_list_picked(self, event: NodeList.Picked) -> None:
        self.navigation.picked_in_list(event)

    def on_results_jump(self, event: Results.Jump) -> None:
        self.debugging.jump(event.node, event.tensor, event.index)

    def on_cursor_moved(self, message: m.CursorMoved) -> None:
        self.work.cursor_moved(message.tensor)

    def on_inspector_summary_wanted(self, message: Inspector.SummaryWanted) -> None:
        self.work.summary_wanted(message.kind, message.name, message.array)

    def on_summary_ready(self, message: m.SummaryReady) -> None:
        self.work.summary_ready(message)

    def on_values_ready(self, message: m.ValuesReady) -> None:
        self.work.values_ready(message)

    def on_work_started(self, message: m.WorkStarted) -> None:
        self.work.started(message)

    def on_work_progress(self, message: m.WorkProgress) -> None:
        self.work.progress(message)

    def on_worker_state_changed(self, event) -> None:
        self.work.state_changed(event)

    def on_gradient_ready(self, message: m.GradientReady) -> None:
        self.work.gradient_ready(message)

    def on_check_ready(self, message: m.CheckReady) -> None:
        self.work.check_ready(message)

    def on_diff_ready(self, message: m.DiffReady) -> None:
        self.diffing.ready(message)

    def on_export_done(self, message: m.ExportDone) -> None:
        self.work.export_done(message)

    def on_trace_ready(self, message: m.TraceReady) -> None:
        self.stepping.trace_ready(message)

    def on_trace_chunk(self, message: m.TraceChunk) -> None:
        self.stepping.trace_chunk(message)

    def on_local_layout_ready(self, message: m.LocalLayoutReady) -> None:
        self.layout_work.local_ready(message)

    def on_layout_ready(self, message: m.LayoutReady) -> None:
        self.layout_work.layout_ready(message)


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
