"""Every dialog by keyboard alone, exports named by their extension, step keys, cancelled checks."""
from __future__ import annotations

import numpy as np
from textual.widgets import Checkbox, RadioSet

from explorer import messages as m
from explorer.screens.export import ExportScreen, kind_of, mismatch
from explorer.screens.feed import FeedScreen
from explorer.screens.help import HelpScreen
from explorer.screens.step import StepScreen
from explorer.screens.verify import VerifyScreen
from explorer.state import CheckOptions

from .conftest import of_type, opened, plain, settle, spec_app


async def test_verify_options_are_all_reachable_by_tab_and_app_keys_stay_out(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        before = (app.session.y, app.session.xs, app.session.zs, app.session.view)
        await pilot.press("v")
        messages = len(seen)
        screen = app.screen
        assert isinstance(screen, VerifyScreen) and app.focused.id == "verify-run"
        order = []
        for _ in range(8):
            await pilot.press("tab")
            order.append(app.focused.id)
        assert order == ["verify-cancel", "verify-mode", "verify-rtol", "verify-atol", "verify-seed",
                         "verify-order", "verify-per-node", "verify-run"]
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused.id == "verify-order"
        # Main-screen keys on a checkbox: nothing behind the dialog may act on them.
        await pilot.press("x", "c", "g", "s", "y", "r")
        assert app.screen is screen and (app.session.y, app.session.xs, app.session.zs, app.session.view) == before
        assert not of_type(seen[messages:], m.SelectionChanged) and not of_type(seen[messages:], m.WorkStarted)
        await pilot.press("shift+tab", "shift+tab", "shift+tab", "shift+tab")
        assert isinstance(app.focused, RadioSet)
        await pilot.press("right", "right", "right", "enter")  # auto -> full -> sample -> fast
        await pilot.press("tab", *"1e-3", "tab", *"1e-6", "tab", "ctrl+u", "5", "tab", "space", "tab", "space")
        assert [c.value for c in screen.query(Checkbox)] == [True, True]
        await pilot.press("tab")
        assert app.focused.id == "verify-run"
        await pilot.press("enter")
        await settle(app, pilot)
        want = CheckOptions(mode="fast", rtol=1e-3, atol=1e-6, order=2, per_node=True, seed=5)
        assert app.session.check_options == want
        report = of_type(seen, m.CheckReady)[-1].report
        assert report.mode == "fast" and report.order == 2 and report.seed == 5 and report.verdict == "pass"


async def test_feed_dialog_by_keyboard_alone(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        assert app.cursor[1] == "X"
        await pilot.press("f")
        assert isinstance(app.screen, FeedScreen) and app.focused.id == "feed-parameter"
        await pilot.press("shift+tab")
        assert app.focused.id == "feed-kind"
        await pilot.press("down", "enter")  # random -> zeros
        await pilot.press("tab")  # the parameter box is disabled for zeros: on to Apply
        assert app.focused.id == "feed-apply"
        await pilot.press("enter")
        await settle(app, pilot)
        assert not isinstance(app.screen, FeedScreen)
        assert of_type(seen, m.FeedChanged)[-1] == m.FeedChanged("X", "zeros")
        np.testing.assert_array_equal(app.session.feed_values()["X"], 0)
        await pilot.press("f", "tab", "tab", "tab")  # parameter -> Apply -> Clear feed -> Cancel
        assert app.focused.id == "feed-cancel"
        await pilot.press("enter")
        assert not isinstance(app.screen, FeedScreen) and app.session.feed_source("X")[1]


def test_export_kind_comes_from_the_extension():
    assert [kind_of(p) for p in ("a.npz", "b.JSON", "c.dot", "d.gv", "back.svg", "e.png", "f.txt", "g")] == \
        ["gradients", "report", "dot", "dot", "svg", "svg", None, None]
    assert mismatch("svg", "back.svg") is None
    assert mismatch("gradients", "back.svg") == \
        "back.svg names a SVG/PNG graph file; a gradients file ends in .npz"
    assert mismatch("report", "out.txt").startswith("out.txt: the extension picks the format; use .npz")


async def test_export_dialog_follows_the_extension_and_refuses_unknown_ones(tmp_path, monkeypatch, recorded):
    seen, hook = recorded
    monkeypatch.chdir(tmp_path)
    app = spec_app()
    async with opened(app, hook, run=True) as pilot:
        await pilot.press("e")
        screen = app.screen
        assert isinstance(screen, ExportScreen) and screen.what == "gradients"
        await pilot.press("ctrl+u", *"back.svg")
        await pilot.pause()
        assert screen.what == "svg" and screen.query_one("#export-svg").value
        await pilot.press("ctrl+u", *"notes.txt", "enter")
        assert app.screen is screen and "use .npz (gradients)" in plain(screen.query_one("#export-error"))
        await pilot.press("ctrl+u", *"back.svg", "enter")
        await settle(app, pilot)
        assert (tmp_path / "back.svg").read_text().lstrip().startswith("<?xml")
        assert of_type(seen, m.ExportDone)[-1].what == "svg"
        await pilot.press("e", "shift+tab")  # from the path back to the kinds
        assert app.focused.id == "export-what"
        await pilot.press("right", "enter")  # gradients -> report, and the name's extension follows
        await pilot.pause()
        assert app.screen.query_one("#export-path").value == "spec_conv_gemm_report.json"
        await pilot.press("tab", "enter")
        await settle(app, pilot)
        assert (tmp_path / "spec_conv_gemm_report.json").exists()
        app.start_export("gradients", "back2.svg")  # the palette's path: refused, nothing written
        await settle(app, pilot)
        assert not (tmp_path / "back2.svg").exists()
        assert app._notifications and "names a SVG/PNG graph file" in list(app._notifications)[-1].message


async def test_step_mode_arrows_step_as_the_header_help_and_docs_say(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        await pilot.press("s")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StepScreen) and screen.position == 0
        graph = screen.query_one("#step-graph")
        scroll = (graph.scroll_x, graph.scroll_y)
        await pilot.press("right", "right", "right")
        assert screen.position == 3 and screen.frame.phase == "reverse"
        await pilot.press("left")
        assert screen.position == 2 and (graph.scroll_x, graph.scroll_y) == scroll
        await pilot.press("end")
        assert screen.position == len(screen.trace.frames) - 1
        await pilot.press("home", "n", "space", "p")
        assert screen.position == 1
        title = plain(screen.query_one("#step-title"))
        assert "→ n space next" in title and "← p back" in title
        keys = {b.id: b.key for b in StepScreen.BINDINGS}
        assert keys["step.next"] == "right,n,space" and keys["step.back"] == "left,p"
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "right,n,space" in plain(app.screen.query_one("Static:last-of-type"))


async def test_cancelled_check_clears_progress_and_the_old_verdict(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        app.run_check(app.session.check_job(CheckOptions(mode="fast")))
        await settle(app, pilot)
        assert app.session.check.verdict == "pass" and "verdict pass" in plain(app.query_one("#verify-summary"))
        job = app.session.check_job(CheckOptions(mode="full"))

        def slow_run(progress=None, should_stop=None):
            import time

            done = 0
            while not should_stop():  # a long check reporting progress until it sees the cancel
                done += 1
                progress(done, 34822, "elements")
                time.sleep(0.005)
            for _ in range(5):  # progress already on its way when the worker notices
                progress(done, 34822, "elements")
            return None

        object.__setattr__(job, "run", slow_run)
        app.run_check(job)
        await pilot.pause(0.2)
        status = app.query_one("#status")
        assert "verifying: elements" in plain(status.query_one("#status-text"))
        assert "verifying" in plain(app.query_one("#verify-summary")) and app.session.check is None
        assert app.query_one("#results-tabs").active == "tab-verify"
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.pause(0.1)
        assert of_type(seen, m.WorkFinished)[-1] == m.WorkFinished("check", "cancelled")
        assert plain(status.query_one("#status-text")).strip() == "cancelled: verifying"
        assert not status.has_class("-busy")
        summary = plain(app.query_one("#verify-summary"))
        assert "check cancelled" in summary and "pass" not in summary
        assert app.session.check is None and app.query_one("#verify-table").row_count == 0


async def test_escape_in_the_inspector_hands_the_keys_back_to_the_graph():
    app = spec_app()
    async with opened(app) as pilot:
        graph, box = app.query_one("#graph"), app.query_one("#inspector-slice")
        assert app.focused is graph and not box.display  # shown only in the focused inspector
        assert "tab here to slice" in plain(app.query_one("#inspector-page"))  # X is 4-d
        for _ in range(12):
            if app.focused is box:
                break
            await pilot.press("tab")
        assert app.query_one("#inspector").has_class("-sliceable") and box.display
        assert "tab here to slice" not in plain(app.query_one("#inspector-page"))
        await pilot.press("s", "n")  # letters in a text box are text: no step mode
        assert box.value == "sn" and not isinstance(app.screen, StepScreen)
        await pilot.press("escape", "s")
        await settle(app, pilot)
        assert app.focused is not box and isinstance(app.screen, StepScreen)


async def test_q_in_a_dialog_does_not_end_the_app_but_q_on_the_main_screen_does(recorded):
    _, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        await pilot.press("v")  # focus on Run check: a button, so nothing types the q
        assert isinstance(app.screen, VerifyScreen) and app.focused.id == "verify-run"
        await pilot.press("q")
        await settle(app, pilot)
        assert app.is_running and isinstance(app.screen, VerifyScreen)
        await pilot.press("escape", "q")
        await settle(app, pilot)
        assert not app.is_running


async def test_the_main_screen_shows_with_the_graph_focused_not_the_search_box():
    """In a terminal the screen can show (and Textual focus the first focusable widget, the
    navigator's search box) after the model opened and focused the graph: y, x, r would then be typed
    into the search. Shown again, the main screen focuses the graph; a dialog keeps its own focus."""
    from textual import events

    from explorer.widgets.graph_view import GraphView

    app = spec_app()
    async with opened(app) as pilot:
        app.screen.set_focus(None)
        app.screen.post_message(events.ScreenResume())
        await pilot.pause(0.2)
        assert isinstance(app.focused, GraphView)
        await pilot.press("c")
        assert app.session.y is None
        await pilot.press("y")  # a key for the app, not a letter for the search box
        assert app.session.y is not None and not app.query_one("#node-list Input").value
        await pilot.press("f")
        await pilot.pause(0.2)
        assert isinstance(app.screen, FeedScreen) and not isinstance(app.focused, GraphView)
