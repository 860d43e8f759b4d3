"""Chasing a gradient bug in the app (issue 20): the dims dialog and the dims in the header, one key
for the inputs zs lacks, every finding and node result in the Verify tab worst first with Enter
going there, NaN/Inf in a run's gradients marked with its origin and `n` going to it."""
from __future__ import annotations

import numpy as np
from textual.widgets import DataTable, Input

import engine
from explorer import messages as m
from explorer.app import make_app
from explorer.feeding import FeedSource
from explorer.screens.dims import DimsScreen
from explorer.state import CheckOptions
from tests.debug_models import hidden_nan_attention, token_embeddings

from .conftest import SIZE, of_type, plain, settle, started


def _app(proto):
    app = make_app(model=engine.load(proto), label=proto.graph.name)
    app.raise_errors = True
    return app


def _attention_app():
    """Y, xs X, zs mask, the mask all zeros: every key masked, the Softmax all NaN."""
    app = _app(hidden_nan_attention())
    app.session.select("Y", ["X"], ["mask"])
    app.session.set_feed("mask", FeedSource("zeros"))
    return app


def _keys(app) -> set[str]:
    return {k.key for k in app.screen_stack[0].query_one("FittingFooter").shown()}


async def test_dims_dialog_sizes_the_made_up_values_and_the_header_shows_them(recorded):
    assert all(b.id and b.description for b in DimsScreen.BINDINGS)
    seen, hook = recorded
    app = _app(token_embeddings())
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        bar = app.query_one("#selection-bar")
        assert "dims batch=1 seq=1" in plain(bar) and "D" in _keys(app)
        await pilot.press("D")
        assert isinstance(app.screen, DimsScreen)
        batch, seq = app.screen.query(Input)
        assert app.screen.focused is batch
        batch.value = "0"
        await pilot.press("enter")
        assert "batch: give a positive integer" in str(app.screen.query_one("#dims-error").content)
        batch.value = "2"
        seq.value = "16"
        await pilot.press("enter")
        await settle(app, pilot)
        assert not isinstance(app.screen, DimsScreen)
        assert app.session.dims == {"batch": 2, "seq": 16} and "dims batch=2 seq=16" in plain(bar)
        feeds = app.session.feed_values()
        assert feeds["input_ids"].shape == feeds["attention_mask"].shape == (2, 16)
        assert (feeds["attention_mask"] == 1).all()  # ones: named like a mask
        await pilot.press("D")
        await pilot.press("escape")
        assert app.session.dims == {"batch": 2, "seq": 16}


async def test_one_key_puts_the_needed_inputs_in_zs_and_the_bar_says_why_x_is_allowed(recorded):
    seen, hook = recorded
    app = _app(token_embeddings())
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        app.session.select("y", ["x"])
        app.selection_changed()
        await pilot.pause()
        bar = plain(app.query_one("#selection-bar"))
        assert "depends on 'attention_mask' and 'input_ids'" in bar and "i puts them in zs" in bar
        assert "i" in _keys(app)
        await pilot.press("i")
        await pilot.pause()
        assert app.session.zs == ("input_ids", "attention_mask") and app.session.spec is not None
        assert of_type(seen, m.SelectionChanged)[-1].zs == ("input_ids", "attention_mask")
        bar = plain(app.query_one("#selection-bar"))
        assert "'x' is determined by 'input_ids', allowed as an extension" in bar
        assert "'input_ids' → Shape 'shape'" in bar
        assert "i" not in _keys(app)
        await pilot.press("r")
        await settle(app, pilot)
        assert app.session.gradient.grads["x"].shape == (1, 1, 4)


async def test_verify_lists_every_finding_and_node_worst_first_and_enter_goes_there(recorded):
    seen, hook = recorded
    app = _attention_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        app.run_check(app.session.check_job(CheckOptions(mode="fast", per_node=True)))
        await settle(app, pilot)
        report = app.session.check
        graph = app.session.graph
        table = app.query_one("#verify-table", DataTable)
        labels = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        statuses = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
        assert table.row_count == 1 + len(report.findings) + len(report.nodes)
        assert labels[0] == "X" and labels[1] == "note: nonfinite-gradient at softmax"
        node_statuses = [s for s, label in zip(statuses, labels) if label.startswith("◆")]
        order = {"fail": 0, "inconclusive": 2, "pass": 3, "skipped": 4}
        assert [order[s] for s in node_statuses] == sorted(order[s] for s in node_statuses)
        # the check moved the cursor to where the NaN starts, its NaN value on show
        assert app.cursor == (graph.node_names.index("softmax"), "probs")
        detail = app.query_one("#verify-detail")
        table.focus()
        await pilot.press("down")
        await pilot.pause()
        assert "hidden downstream by node 'hide_nan' (Where)" in " ".join(plain(detail).split())
        app.move_cursor(0, None)
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.cursor[0] == graph.node_names.index("softmax")
        pass_row = statuses.index("pass")
        await pilot.press(*["down"] * (pass_row - 1), "enter")
        await settle(app, pilot)
        name = labels[pass_row][2:].rsplit(" (", 1)[0]
        assert app.cursor[0] == graph.node_names.index(name)


async def test_nan_in_a_run_is_marked_and_n_goes_to_its_origin(recorded):
    seen, hook = recorded
    app = _attention_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        assert "n" not in _keys(app)
        await pilot.press("r")
        await settle(app, pilot)
        origin = of_type(seen, m.GradientReady)[-1].origin
        assert (origin.node, origin.value, origin.hidden_by) == ("softmax", "probs", "hide_nan")
        assert np.isnan(app.session.gradient.grads["X"]).all()
        table = app.query_one("#gradient-table", DataTable)
        assert str(table.get_row("X")[5]) == "24 ✗"
        assert "its output 'probs' holds NaN" in plain(app.query_one("#gradient-note"))
        assert "from node 'softmax': n goes there" in str(app.query_one("#status-text").content)
        assert "n" in _keys(app)
        app.move_cursor(0, None)
        await pilot.press("n")
        await pilot.pause()
        assert app.cursor == (app.session.graph.node_names.index("softmax"), "probs")
        app.session.set_feed("mask", FeedSource("ones"))
        app.results_changed()
        await pilot.press("r")
        await settle(app, pilot)
        assert of_type(seen, m.GradientReady)[-1].origin is None
        assert "n" not in _keys(app) and "gradients computed" in str(app.query_one("#status-text").content)
