"""The verify dialog's auto mode and what the Verify tab says: the engine's verdict words, the mode it
used, how an x was resolved, and for an inconclusive x why and what would settle it. The table
takes the keys when results arrive, except from a dialog or a text box."""
from __future__ import annotations

import threading

from textual.widgets import DataTable, Input, RadioSet

import engine.verify
from engine.verify import CheckReport, XCheck
from explorer import messages as m
from explorer.app import make_app
from explorer.screens.help import HelpScreen
from explorer.screens.verify import MODE_HELP, VerifyScreen
from explorer.state import CHECK_MODES, CheckOptions
from explorer.verdicts import x_rows

from .conftest import of_type, opened, plain, sample, settle, spec_app


def test_the_dialog_offers_the_engines_modes_auto_first():
    assert CHECK_MODES == tuple(engine.verify.MODES) and CHECK_MODES[0] == "auto"
    assert CheckOptions().mode == "auto" and set(MODE_HELP) == set(CHECK_MODES)


def _kinks_app():
    app = make_app(sample("kinks.onnx"))
    app.raise_errors = True
    return app


async def _verify_with_defaults(app, pilot) -> None:
    await pilot.press("v")
    assert isinstance(app.screen, VerifyScreen)
    await pilot.press("enter")  # Run check has the focus: the dialog's defaults
    await settle(app, pilot)


async def test_v_defaults_to_auto_and_the_engine_picks_the_mode(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        await pilot.press("v")
        screen = app.screen
        assert isinstance(screen, VerifyScreen)
        assert str(screen.query_one(RadioSet).pressed_button.label) == "auto"
        assert plain(screen.query_one("#verify-mode-help")).strip() == MODE_HELP["auto"]
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.session.check_options.mode == "auto"
        report = of_type(seen, m.CheckReady)[-1].report
        assert report.auto and report.mode in ("full", "fast") and report.verdict == "pass"
        summary = plain(app.query_one("#verify-summary"))
        assert "verdict pass" in summary and f"mode {report.mode} (auto)" in summary
        table = app.query_one("#verify-table", DataTable)
        assert [str(c) for c in table.get_row("x:W")[1:3]] == ["pass", report.results[0].resolved_by]
        assert plain(app.query_one("#verify-detail")).startswith(f"{report.mode} mode (auto): ")
        # The table has the keys: down moves its cursor without a tab first.
        assert app.focused is table and table.cursor_row == 0
        await pilot.press("down")
        assert table.cursor_row == 1


async def test_an_inconclusive_x_says_why_and_what_would_settle_it(recorded):
    seen, hook = recorded
    app = _kinks_app()
    async with opened(app, hook) as pilot:
        app.session.select("loss", ["X", "Y"])
        app.selection_changed()
        await _verify_with_defaults(app, pilot)
        report = app.session.check
        assert report.verdict == "inconclusive" and report.auto
        x = report.results[0]
        assert x.status == "inconclusive" and x.reason and x.advice
        assert "verdict inconclusive" in plain(app.query_one("#verify-summary"))
        table = app.query_one("#verify-table", DataTable)
        assert app.focused is table
        assert [str(c) for c in table.get_row("x:X")[:3]] == ["X", "inconclusive", ""]
        assert f"mode {report.mode} (auto)" in plain(app.query_one("#verify-summary"))
        detail = " ".join(plain(app.query_one("#verify-detail")).split())
        assert detail.startswith(f"{report.mode} mode (auto): ")
        assert " ".join(x.reason.split()) in detail
        assert "to settle it: " + " ".join(x.advice.split()) in detail
        await pilot.press("down")  # Y's row: its own reason
        detail = " ".join(plain(app.query_one("#verify-detail")).split())
        assert " ".join(report.results[1].reason.split()) in detail


def test_a_resolved_x_says_how_and_a_cancelled_one_keeps_its_word():
    def x(name, status, **kw):
        return XCheck(name=name, status=status, max_abs_err=None, max_rel_err=None, worst_index=None,
                      analytic=None, numeric=None, fd_error=None, checked=3, failed=0, inconclusive=0, **kw)

    report = CheckReport(ok=False, verdict="cancelled", mode="fast", auto=True, seed=0, order=1, y="Y",
                         results=(x("W", "pass", resolved_by="nodes", reason="each node passed alone"),
                                  x("Z", "cancelled", reason="checked 3 of 9", advice="run the check again")))
    w, z = x_rows(report)
    assert (w.status, w.resolved_by) == ("pass", "nodes")
    assert w.detail == "fast mode (auto), resolved by nodes: each node passed alone"
    assert (z.status, z.resolved_by) == ("cancelled", "")
    assert z.detail == "fast mode (auto): checked 3 of 9\nto settle it: run the check again"


async def _held_check(app, pilot):
    """A check that waits for the returned event before it starts."""
    go = threading.Event()
    job = app.session.check_job(CheckOptions())
    original = job.run

    def held(progress=None, should_stop=None):
        go.wait(10)
        return original(progress, should_stop)

    object.__setattr__(job, "run", held)
    app.run_check(job)
    await pilot.pause(0.1)
    return go


async def test_results_do_not_take_the_focus_from_a_dialog_opened_meanwhile(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        go = await _held_check(app, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        focused = app.focused
        go.set()
        await settle(app, pilot)
        assert of_type(seen, m.CheckReady) and isinstance(app.screen, HelpScreen) and app.focused is focused
        main = app.screen_stack[0]
        assert main.focused is not main.query_one("#verify-table")


async def test_results_do_not_take_the_focus_from_a_text_box(recorded):
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        go = await _held_check(app, pilot)
        await pilot.press("slash", "c", "o")
        box = app.focused
        assert isinstance(box, Input)
        go.set()
        await settle(app, pilot)
        assert of_type(seen, m.CheckReady) and app.focused is box
        await pilot.press("n")  # still typed into the box, not the culprit key
        assert box.value == "con"
        assert app.query_one("#verify-table", DataTable).row_count == 2


async def test_a_check_with_no_rows_leaves_the_focus(recorded):
    """Nothing to move through: the keys stay where they were (the graph)."""
    seen, hook = recorded
    app = spec_app()
    async with opened(app, hook) as pilot:
        app.query_one("#results").show_check(CheckReport(ok=False, verdict="inconclusive", mode="full", seed=0,
                                                         order=1, results=()))
        app.query_one("#results").focus_check()
        await pilot.pause()
        assert app.focused is app.query_one("#graph")
        assert app.query_one("#verify-table", DataTable).row_count == 0
