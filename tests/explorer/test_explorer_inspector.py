"""The inspector's page: it scrolls itself, starts at the top for a new subject, and a cursor move
never makes the screen lay out again (that layout would be most of an arrow key's time on big models)."""
from __future__ import annotations

from textual import events
from textual.screen import Screen

import engine
from explorer.app import make_app
from tests.big_models import residual_chain

from .conftest import opened, plain, settle, spec_app


def wheel(page, event_type) -> None:
    """A wheel turn over the page, as the driver sends it (Pilot has no wheel)."""
    page.post_message(event_type(page, 2, 2, 0, 0, 0, False, False, False))


def page_lines(app) -> list[str]:
    page = app.query_one("#inspector-page")
    return [page.render_line(y).text for y in range(page.size.height)]


async def test_the_page_wraps_at_its_width_and_scrolls_by_keys_and_wheel():
    app = spec_app()
    async with opened(app, size=(80, 24), run=True) as pilot:
        page = app.query_one("#inspector-page")
        width, height = page.size
        assert page.line_count > height  # X's text and heatmap do not fit at 80x24
        assert all(len(line) == width for line in page_lines(app))
        assert page_lines(app)[0].startswith("▸ X")
        assert page_lines(app)[0].rstrip().endswith("┃")  # the thumb of the scroll indicator, at the top
        app.query_one("#inspector").focus()
        await pilot.pause()
        height = page.size.height  # X is 4-d: the focused inspector shows the slice box below the page
        assert app.query_one("#inspector-slice").display and height < page.line_count
        await pilot.press("down", "down")
        assert page.offset_y == 2 and page_lines(app)[0] == page.render_line(0).text
        await pilot.press("end")
        assert page.offset_y == page.line_count - height
        assert "±" in "".join(page_lines(app))  # the heatmap's legend, last, is in view
        await pilot.press("home")
        assert page.offset_y == 0
        await pilot.press("pagedown")
        assert page.offset_y == min(height - 1, page.line_count - height)
        wheel(page, events.MouseScrollDown)
        await pilot.pause()
        assert page.offset_y == min(height + 2, page.line_count - height)
        wheel(page, events.MouseScrollUp)
        await pilot.pause()
        assert page.offset_y == min(height - 1, page.line_count - height)


async def test_a_new_subject_starts_at_the_top_and_new_values_keep_the_place():
    app = spec_app()
    async with opened(app, size=(80, 24), run=True) as pilot:
        inspector, page = app.query_one("#inspector"), app.query_one("#inspector-page")
        inspector.focus()
        await pilot.press("down", "down", "down")
        assert page.offset_y == 3
        inspector.refresh_content()  # the same subject, updated (values arriving): same place
        assert page.offset_y == 3
        app.move_cursor(None, "W")
        await settle(app, pilot)
        assert page.offset_y == 0 and "▸ W" in plain(page)


async def test_the_graph_keeps_the_focus_and_the_slice_box_is_reachable():
    app = spec_app()
    async with opened(app) as pilot:
        graph = app.query_one("#graph")
        assert app.focused is graph
        await pilot.press("down")  # arrows in the graph move the cursor, not the inspector's page
        await settle(app, pilot)
        assert app.query_one("#inspector-page").offset_y == 0 and app.cursor != (None, "X")


async def test_cursor_moves_on_a_big_model_never_lay_the_screen_out_again():
    """Subjects of different text heights one after another: the page repaints, nothing moves."""
    app = make_app(model=engine.load(residual_chain(60)), label="chain")
    app.raise_errors = True
    layouts = []
    original = Screen._refresh_layout

    def counting(screen, *args, **kwargs):
        if not kwargs.get("scroll"):
            layouts.append(screen)
        return original(screen, *args, **kwargs)

    async with opened(app) as pilot:
        await pilot.pause(0.5)
        region = app.query_one("#inspector-page").region
        Screen._refresh_layout = counting
        try:
            heights = set()
            for _ in range(12):
                await pilot.press("down")
                await pilot.pause(0.05)
                heights.add(app.query_one("#inspector-page").line_count)
            await settle(app, pilot)
        finally:
            Screen._refresh_layout = original
        assert len(heights) > 1  # the subjects really had different heights
        assert app.query_one("#inspector-page").region == region
        assert layouts == []
