"""The App's collaborators, each on its own: a real Session, fakes for what they ask of the App."""
from __future__ import annotations

import engine
from engine import examples
from explorer import messages as m
from explorer.app import ExplorerApp
from explorer.debugging import Debugging
from explorer.host import Shown
from explorer.keys import Keys
from explorer.pacing import Pacing
from explorer.selecting import Selection
from explorer.state import Session
from explorer.work import Work


class FakeApp:
    """What the collaborators' Protocols name, recorded: notifications, messages, screens, workers."""

    def __init__(self, screens: int = 1):
        self.notes: list[tuple[str, str]] = []
        self.posted: list = []
        self.later: list = []
        self.started: list[dict] = []
        self.moves: list[tuple] = []
        self.status = FakeWidget()
        self.screen_stack = [FakeScreen(self.status) for _ in range(screens)]
        self.workers: list = []
        self.focused = None

    def notify(self, message, *, title="", severity="information", timeout=None):
        self.notes.append((severity, message))

    def post_message(self, message):
        self.posted.append(message)
        return True

    def call_later(self, callback, *args):
        self.later.append((callback, args))
        return True

    def run_worker(self, work, **kwargs):
        self.started.append(kwargs)

    def move_cursor(self, node_index, tensor):
        self.moves.append((node_index, tensor))


class FakeWidget:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, *args))


class FakeScreen:
    def __init__(self, status):
        self.status = status

    def query_one(self, selector):
        assert selector == "#status"
        return self.status


def session() -> Session:
    return Session(engine.load(examples.spec_conv_gemm()), "spec")


def test_the_app_is_one_textual_app_and_each_binding_has_its_action_beside_it():
    assert all(cls.__module__.split(".")[0] in ("textual", "typing", "builtins") for cls in ExplorerApp.__mro__[1:])
    missing = [b.action for b in ExplorerApp.BINDINGS if f"action_{b.action.split('(')[0]}" not in vars(ExplorerApp)]
    assert not missing, missing


def test_the_app_provides_what_each_collaborator_asks_of_it():
    from explorer.app import make_app
    from explorer.debugging import DebuggingApp
    from explorer.graph_work import LayoutApp
    from explorer.keys import KeysApp
    from explorer.navigation import NavigationApp
    from explorer.settings import SettingsApp
    from explorer.stepping import SteppingApp
    from explorer.work import WorkApp

    provided = set(dir(make_app()))
    for protocol in (DebuggingApp, LayoutApp, KeysApp, NavigationApp, SettingsApp, SteppingApp, WorkApp):
        names = {n for c in protocol.__mro__ if c.__module__.startswith("explorer.")
                 for n in (*vars(c).get("__annotations__", {}), *(k for k, v in vars(c).items() if callable(v)))
                 if not n.startswith("__")}
        assert names and names <= provided, (protocol.__name__, sorted(names - provided))


def test_selection_changes_the_session_at_the_cursor_and_says_why_when_it_cannot():
    app, changes = FakeApp(), []
    shown = Shown(session())
    selection = Selection(shown, app.notify, lambda: changes.append(shown.session.y))
    selection.set_y()  # no tensor under the cursor
    assert shown.session.y is None and not changes and "Move to a tensor" in app.notes[-1][1]
    shown.cursor = (3, "Y")
    selection.set_y()
    shown.cursor = (None, "W")
    selection.toggle_x()
    assert (shown.session.y, shown.session.xs, changes) == ("Y", ("W",), ["Y", "Y"])
    selection.zs_inputs()
    assert shown.session.zs == ("X",) and app.notes[-1] == ("information", "zs += X")
    selection.zs_inputs()
    assert app.notes[-1] == ("warning", "no graph input is missing from the selection") and len(changes) == 3
    selection.clear()
    assert (shown.session.y, shown.session.xs, shown.session.zs) == (None, (), ())


def test_work_asks_for_values_once_and_refuses_an_export_with_nothing_to_write():
    app = FakeApp()
    shown = Shown(session())
    work = Work(shown, app)
    work.request_values(["H"])  # a small model: computed as soon as the cursor lands
    assert [(f.__name__, args) for f, args in app.later] == [("_start_values", (["H"],))]
    shown.session.values["H"] = object()
    work.request_values(["H"])  # already known: nothing more
    assert len(app.later) == 1
    work.start_export("gradients", "grads.npz")
    assert app.notes[-1] == ("warning", "no gradients yet: press r to run first") and not app.started
    shown.session.select("Y", ("W",), ("X",))
    work.run_gradient(shown.session.gradient_job())
    assert app.started == [dict(name="_gradient", group="gradient", description="gradient", exclusive=True,
                                exit_on_error=False, thread=True)]


def test_work_drops_a_gradient_for_an_old_selection():
    app = FakeApp()
    shown = Shown(session())
    work = Work(shown, app)
    work.gradient_ready(m.GradientReady(shown.session.generation - 1, None, None, None, {}))
    assert app.status.calls == [("idle", "ready (a result for old settings was dropped)")]
    assert [(p.kind, p.outcome) for p in app.posted] == [("gradient", "stale")]


def test_keys_leave_the_footer_when_they_mean_nothing():
    app = FakeApp()
    shown = Shown(None)
    running = []
    keys = Keys(shown, app, ExplorerApp.BINDINGS, lambda: bool(running), lambda: None)
    assert keys.applies("help") and not keys.applies("run")  # no model: open one, or quit
    shown.session = session()
    assert keys.applies("run") and not keys.applies("cancel") and not keys.applies("go_to_culprit")
    assert not keys.applies("next_tensor") and not keys.applies("clear_selection")
    running.append("check")
    shown.cursor = (None, "X")
    assert keys.applies("cancel") and keys.applies("next_tensor")
    app.screen_stack.append(FakeScreen(app.status))  # a dialog on top: the main screen's keys are off
    assert not keys.applies("run") and keys.applies("quit") and keys.applies("focus_next")


def test_debugging_goes_to_the_node_a_result_row_names_and_says_when_there_is_no_culprit():
    app = FakeApp()
    shown = Shown(session())
    debugging = Debugging(shown, app)
    assert debugging.culprit() is None
    debugging.go_to_culprit()
    assert app.notes[-1][0] == "warning" and not app.moves
    debugging.jump("gemm", "Z", None)
    debugging.jump("conv", "Y", None)  # not the node's tensor: the node alone
    assert app.moves == [(3, "Z"), (0, None)]


def test_pacing_holds_work_handed_over_while_a_key_is_answered():
    class Foreground:
        busy = True

    class Owner:
        def __init__(self):
            self.timers = []
            self.is_running = True

        def set_timer(self, delay, callback):
            self.timers.append(callback)

    pacing, owner, ran = Pacing(Foreground()), Owner(), []
    pacing.after_input(owner, lambda: ran.append(True))
    assert not ran and pacing.put_off == 1
    pacing.foreground.busy = False
    owner.timers.pop()()
    assert ran == [True] and pacing.put_off == 0
    pacing.foreground.busy = True
    pacing.after_input(owner, lambda: ran.append("late"))
    owner.is_running = False  # shutting down: the screens are gone before the timer fires
    owner.timers.pop()()
    assert ran == [True] and pacing.put_off == 0
