"""Opening a big model (issue 10, scale): the graph pane shows the cursor's neighbourhood in the first
frame, keeps working while the whole layout is made in a worker, and swaps the whole layout in
with the cursor still selected and in view. The whole layout is held back by an Event here, so
"before it is done" is a state the test controls, not a race it hopes to win."""
from __future__ import annotations

import threading

import pytest

import engine
import explorer.graph_work
import explorer.layout
from explorer import messages as m
from explorer.app import make_app
from explorer.measure import FrameClock

from ..big_models import residual_chain
from .conftest import SIZE, of_type, settle
from .test_explorer_viewport import assert_selection_in_view

BLOCKS = 150  # 601 nodes: past the explorer's LOCAL_FROM_NODES, small enough to lay out quickly


@pytest.fixture
def held(monkeypatch):
    """The whole layout waits for `held.set()` (at most 180 s: a test failing before the release cannot hang CI).
    Neighbourhoods of 16 boxes: a few key presses reach the rim of one."""
    monkeypatch.setattr(explorer.layout, "LOCAL_BOXES", 16)
    gate = threading.Event()
    original = explorer.graph_work.layout_for

    def layout_for(*args, **kwargs):
        gate.wait(180)
        return original(*args, **kwargs)

    monkeypatch.setattr(explorer.graph_work, "layout_for", layout_for)
    yield gate
    gate.set()


def chain_app():
    app = make_app(model=engine.load(residual_chain(BLOCKS)), label="chain")
    app.raise_errors = True
    return app


async def whole_layout(app, pilot, gate) -> None:
    gate.set()
    for _ in range(500):
        if app.local is None:
            break
        await pilot.pause(0.02)
    await settle(app, pilot)


async def test_the_first_frame_draws_the_neighbourhood_and_the_swap_keeps_the_cursor_in_view(held, recorded):
    seen, hook = recorded
    app = chain_app()
    clock = FrameClock()
    clock.install(app)
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await pilot.pause()
        graph = app.query_one("#graph")
        assert clock.graph_frame is not None and clock.graph_frame == clock.frames[0]  # drawn in the first frame
        assert app.local is not None and not app.local.complete and ("forward", None) not in app.layouts
        assert app.cursor == (None, "input") and graph.selected == "t:input"
        assert_selection_in_view(graph)
        status = str(app.query_one("#status-text").content)
        assert "nearest the cursor" in status and f"{app.local.total:,}" in status

        # Arrows walk the neighbourhood, and past its rim a new one is laid out around the cursor.
        first = {n.id for n in graph.canvas.layout.nodes}
        for _ in range(14):
            await pilot.press("down")
        await pilot.pause()
        node, _ = app.cursor
        assert node is not None and node >= 12 and f"n{node}" not in first  # past the first neighbourhood
        assert graph.canvas.nodes[graph.selected].node_index == node
        assert_selection_in_view(graph)
        assert not of_type(seen, m.LayoutReady)  # all of this before the whole layout exists

        # A search jump far away: the pane follows at once.
        target = app.session.graph.node_names.index(f"block{BLOCKS - 5}/relu")
        await pilot.press("slash", *f"block{BLOCKS - 5}/relu", "enter")
        await pilot.pause()
        assert app.cursor[0] == target and graph.canvas.nodes[graph.selected].node_index == target
        assert_selection_in_view(graph)

        await whole_layout(app, pilot, held)
        assert app.local is None and of_type(seen, m.LayoutReady)
        assert len(graph.canvas.layout.nodes) == len(app.layouts[("forward", None)].nodes) > 601
        assert app.cursor[0] == target and graph.canvas.nodes[graph.selected].node_index == target
        assert_selection_in_view(graph)
        assert str(app.query_one("#status-text").content) == "ready"  # the note is taken back


async def test_a_view_switch_shows_the_backward_neighbourhood_first_and_run_works_meanwhile(held, recorded):
    seen, hook = recorded
    app = chain_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await pilot.pause()
        app.session.set_y("loss")
        app.session.toggle_x("input")
        app.selection_changed()
        await pilot.press("g")
        graph = app.query_one("#graph")
        for _ in range(500):  # the backward neighbourhood is cut from the backward view, in the worker
            if app.local is not None and app.session.view == "backward" and graph.selected is not None:
                break
            await pilot.pause(0.02)
        assert of_type(seen, m.LocalLayoutReady) and app.local is not None
        assert all(n.id.startswith("bw/") for n in graph.canvas.layout.nodes)
        assert_selection_in_view(graph)
        await pilot.press("r")  # run does not wait for the drawing
        for _ in range(500):
            if app.session.gradient is not None:
                break
            await pilot.pause(0.02)
        assert app.session.gradient is not None and "input" in app.session.gradient.grads
        await whole_layout(app, pilot, held)
        assert app.local is None and app.session.view == "backward"
        assert len(graph.canvas.layout.nodes) == len(app.layouts[("backward", app.session.spec)].nodes)
        assert_selection_in_view(graph)
        await pilot.press("g", "g")  # combined, then forward again: each laid out in full in the end
        await whole_layout(app, pilot, held)
        assert app.session.view == "forward" and app.local is None
        assert_selection_in_view(graph)


async def test_the_navigator_is_listed_after_the_first_frame_and_follows_the_cursor(held):
    app = chain_app()
    async with app.run_test(size=SIZE) as pilot:
        listing = app.query_one("#node-options")
        for _ in range(500):  # the listing worker (the layout is still held)
            if listing.entries:
                break
            await pilot.pause(0.02)
        assert app.local is not None and len(listing.entries) > 600
        hl = listing.entries[listing.highlighted]
        assert hl.tensor == "input"
        await pilot.press("down", "down")
        await pilot.pause()
        hl = listing.entries[listing.highlighted]
        assert (hl.node_index, hl.tensor) == app.cursor or hl.node_index == app.cursor[0]
        await whole_layout(app, pilot, held)


async def test_another_model_opened_meanwhile_never_shows_the_first_ones_layout(held):
    app = chain_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        other = engine.load(residual_chain(BLOCKS + 30))
        app.post_message(m.ModelOpened("other", other))
        await pilot.pause()
        assert app.session.model is other and app.local is not None
        await whole_layout(app, pilot, held)
        graph = app.query_one("#graph")
        whole = engine.layout_graph(other, None, "forward", engine="layered")
        assert app.local is None and len(graph.canvas.layout.nodes) == len(whole.nodes)
        assert {n.id for n in graph.canvas.layout.nodes} == {n.id for n in whole.nodes}
        assert_selection_in_view(graph)
