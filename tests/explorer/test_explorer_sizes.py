"""The main screen at 80x24, 120x40 and 200x50: panes share the width, the footer fits, nothing is cut."""
from __future__ import annotations

import pytest

from .conftest import opened, settle, spec_app

SIZES = [(80, 24), (120, 40), (200, 50)]


def _footer_row(app) -> tuple[list[str], int]:
    """The actions of the keys the footer shows, and the columns they take."""
    footer = app.screen.query_one("FittingFooter")
    row = footer.render_line(0).text.rstrip()
    return [k.action for k in footer.shown()], len(row)


@pytest.mark.parametrize("size", SIZES)
async def test_panes_share_the_width_and_the_footer_fits(size):
    app = spec_app()
    async with opened(app, size=size) as pilot:
        await pilot.press("down")  # a node under the cursor: "o Next" joins the footer
        await settle(app, pilot)
        await pilot.pause(0.2)
        width = size[0]
        panes = {k: app.query_one(f"#{k}").outer_size.width for k in ("node-list", "graph", "inspector")}
        assert sum(panes.values()) == width
        assert panes["graph"] >= 0.45 * width and min(panes.values()) >= 16, panes
        assert panes["graph"] > panes["inspector"] > panes["node-list"]
        actions, used = _footer_row(app)
        assert used <= width, (actions, used)
        assert {"quit", "set_y", "toggle_x", "feed", "run", "verify", "step"} <= set(actions)
        if width >= 120:
            assert {"help", "search", "export", "cycle_view", "next_tensor"} <= set(actions)
        bar = app.query_one("#selection-bar")
        assert bar.outer_size.height >= 2 and "valid" in str(bar.content).splitlines()[-1]


async def test_the_combined_view_fits_at_120_columns():
    app = spec_app()
    async with opened(app, size=(120, 40)) as pilot:
        await pilot.press("g", "g")
        await settle(app, pilot)
        graph = app.query_one("#graph")
        assert app.session.view == "combined"
        assert graph.canvas.layout.width <= graph.scrollable_content_region.width


async def test_a_long_placeholder_wraps_in_a_narrow_graph():
    app = spec_app()
    async with opened(app, size=(80, 24)) as pilot:
        graph = app.query_one("#graph")
        text = "the combined view needs a valid selection: y and xs (press y on a tensor, then x on another)"
        graph.set_layout(None, text)
        await pilot.pause()
        width = graph.scrollable_content_region.width
        assert width < len(text)
        lines = [graph.render_line(y).text.strip() for y in range(graph.scrollable_content_region.height)]
        assert " ".join(t for t in lines if t) == text


async def test_keys_coming_and_going_repaint_the_footer_without_a_layout():
    """Textual's Footer remounted every key per bindings change, and each remount re-ran the whole
    screen's layout (~50-100 ms of the main thread on GPT-2, three times for one `r`): the first
    key pressed after it waited. FittingFooter draws the keys as one line: a key coming, going or
    turning dim is a repaint of that line."""
    app = spec_app()
    async with opened(app, size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.pause(0.2)
        footer, screen = app.screen.query_one("FittingFooter"), app.screen
        layouts, refresh_layout = [], screen._refresh_layout
        screen._refresh_layout = lambda *a, **k: (layouts.append(1), refresh_layout(*a, **k))[1]
        assert "verify" in [k.action for k in footer.shown()]
        check_action = app.check_action
        for hide in (False, None, True):  # verify leaves, turns dim, comes back
            app.check_action = (lambda a, p, hide=hide: hide if a == "verify" else check_action(a, p))
            app.refresh_footer(force=True)
            await pilot.pause(0.1)
            keys = {k.action: k for k in footer.shown()}
            assert ("verify" in keys) == (hide is not False)
            assert hide is not None or not keys["verify"].enabled
            assert ("v Verify" in footer.render_line(0).text) == (hide is not False)
        assert layouts == [], "a bindings change ran the screen's layout"
        app.query_one("#selection-bar").refresh(layout=True)  # the hook sees a layout when there is one
        await pilot.pause(0.1)
        assert layouts


async def test_a_click_on_a_footer_key_presses_it():
    app = spec_app()
    async with opened(app, size=(120, 40)) as pilot:
        await settle(app, pilot)
        footer = app.screen.query_one("FittingFooter")
        row = footer.render_line(0).text
        await pilot.click("FittingFooter", offset=(row.index("? Help"), 0))
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "HelpScreen"
