"""The main screen at 80x24, 120x40 and 200x50: panes share the width, the footer fits, nothing is cut."""
from __future__ import annotations

import pytest
from textual.widgets._footer import FooterKey

from .conftest import opened, settle, spec_app

SIZES = [(80, 24), (120, 40), (200, 50)]


def _footer_row(app) -> tuple[list[str], int]:
    """The actions of the keys the footer shows, and the columns they take."""
    footer = app.screen.query_one("FittingFooter")
    shown = [k for k in footer.query(FooterKey) if k.display and all(a.display for a in k.ancestors_with_self
                                                                      if a is not footer and a is not app)]
    used = sum(k.outer_size.width + k.styles.margin.left + k.styles.margin.right for k in shown)
    return [k.action for k in shown], used


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


async def test_footer_remounts_once_for_a_burst_of_changes_and_not_for_none():
    """Textual's Footer remounts every key per bindings change (~50-100 ms of the main thread on
    GPT-2, and `r` sends three); FittingFooter joins a burst into one remount and skips unchanged keys."""
    app = spec_app()
    async with opened(app, size=(120, 40)) as pilot:
        await pilot.press("c")  # no selection: "c Clear" leaves the footer
        await settle(app, pilot)
        await pilot.pause(0.2)
        footer = app.screen.query_one("FittingFooter")
        remounts = []
        recompose = footer.recompose

        async def counted():
            remounts.append(1)
            await recompose()

        footer.recompose = counted
        before = [k.action for k in footer.query(FooterKey)]
        assert "clear_selection" not in before
        for _ in range(3):
            app.refresh_footer(force=True)  # the bindings are announced, the keys are the same
        await pilot.pause(0.2)
        assert remounts == [] and [k.action for k in footer.query(FooterKey)] == before
        await pilot.press("y")  # a selection: "c Clear" joins the footer
        for _ in range(3):
            app.refresh_footer(force=True)
        await settle(app, pilot)
        await pilot.pause(0.2)
        assert len(remounts) == 1, remounts
        assert "clear_selection" in [k.action for k in footer.query(FooterKey)]
