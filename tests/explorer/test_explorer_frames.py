"""One key, one coherent frame: the graph, the list and the inspector follow the cursor together.

The graph and the list announce a move and draw it when the app handles the announcement, with
the other panes; drawing it at once cost a frame per key (twice the render time on big models)
and showed panes that disagreed for a frame.
"""
from __future__ import annotations

import pytest

import engine
from tests.big_models import residual_chain

from .conftest import opened, settle


def chain_app():
    from explorer.app import make_app

    app = make_app(model=engine.load(residual_chain(30)), label="chain")
    app.raise_errors = True
    return app


def watch_frames(app) -> list[tuple]:
    """What each frame handed to the terminal showed: graph box, list row, inspector subject."""
    shown = []
    original = app._display

    def display(screen, renderable):
        if renderable is not None and screen is app.screen_stack[0]:
            listing = app.query_one("#node-options")
            inspector = app.query_one("#inspector")
            shown.append((app.query_one("#graph").selected, listing.highlighted,
                          (inspector.node_index, inspector.tensor)))
        return original(screen, renderable)

    app._display = display
    return shown


def agrees(app, frame) -> bool:
    box, row, subject = frame
    entry = app.query_one("#node-options").entries[row]
    return (box in app.boxes_for(*app.cursor) and subject == app.cursor
            and (entry.node_index, entry.tensor) in (app.cursor, (app.cursor[0], None)))


@pytest.mark.parametrize("pane", ["graph", "list"])
async def test_the_first_frame_after_a_key_shows_every_pane_on_the_new_cursor(pane):
    app = chain_app()
    async with opened(app) as pilot:
        await pilot.pause(0.3)
        if pane == "list":
            app.query_one("#node-options").focus()
        await settle(app, pilot)
        key = "down"
        for _ in range(8):
            before = app.cursor
            frames = watch_frames(app)
            await pilot.press(key)
            await settle(app, pilot)
            app._display = type(app)._display.__get__(app)
            listing = app.query_one("#node-options")
            assert frames and frames[0][1] == listing.highlighted
            if listing.entries[listing.highlighted].group is None:  # a heading moves no cursor
                assert app.cursor != before and agrees(app, frames[0]), (frames[0], app.cursor)


@pytest.mark.parametrize("pane", ["graph", "list"])
async def test_a_burst_of_keys_moves_as_far_as_the_same_keys_one_by_one(pane):
    ends = []
    for burst in (True, False):
        app = chain_app()
        async with opened(app) as pilot:
            await pilot.pause(0.3)
            if pane == "list":
                app.query_one("#node-options").focus()
            keys = ["down"] * 7 + ["up"] * 2 + ["down"] * 3
            if burst:
                await pilot.press(*keys)
            else:
                for key in keys:
                    await pilot.press(key)
                    await settle(app, pilot)
            await settle(app, pilot)
            graph, listing = app.query_one("#graph"), app.query_one("#node-options")
            assert graph.chosen is None and listing.chosen is None  # every announced move was drawn
            ends.append((app.cursor, graph.selected, listing.highlighted))
    assert ends[0] == ends[1]
