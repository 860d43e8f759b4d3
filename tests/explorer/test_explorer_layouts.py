"""One-time events on a big model repaint their own pane, without a whole-screen layout.

Each whole-screen layout made Textual re-lay out and repaint every widget and scrollbar: 25-75 ms
of the UI thread on GPT-2, which a key pressed then waited for. The navigator's listing arriving
, the whole graph layout replacing the cursor's neighbourhood and the gradients filling their table
only change the virtual size of a pane whose box CSS fixes (explorer/widgets/sizing.py).
"""
from __future__ import annotations

import html
import re

from textual.geometry import Size
from textual.screen import Screen

import engine
from explorer.app import make_app
from explorer.graph_work import LayoutWork
from explorer.layout import LOCAL_FROM_NODES
from explorer.widgets.node_list import Entry, NodeList
from explorer.widgets.results import Results
from tests.big_models import residual_chain

from .conftest import SIZE, opened, settle, spec_app
from .test_explorer_large import until

BLOCKS = LOCAL_FROM_NODES // 4 + 10  # 4N + 1 nodes: listed in a worker, drawn as a neighbourhood first


def screen_rows(svg: str) -> dict[int, str]:
    """The text on each row of a Textual screenshot (its SVG puts each run in a row's clip path)."""
    rows: dict[int, str] = {}
    for row, text in re.findall(r'<text [^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">(.*?)</text>', svg):
        rows[int(row)] = rows.get(int(row), "") + html.unescape(text)
    return rows


def rows_that_differ(before: str, after: str) -> dict[int, tuple[str, str]]:
    a, b = screen_rows(before), screen_rows(after)
    return {k: (a.get(k, ""), b.get(k, "")) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def record(monkeypatch, events: list[str]) -> None:
    """Append "layout" for every whole-screen layout, and the events under test as they happen."""
    def wrap(cls, name, label):
        original = getattr(cls, name)

        def recorded(self, *args, **kwargs):
            events.append(label(*args) if callable(label) else label)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, recorded)

    wrap(Screen, "_refresh_layout", "layout")
    wrap(NodeList, "set_listing", lambda listing: "listed" if listing.entries else "placeholder")
    wrap(LayoutWork, "_apply_layout", "whole layout")


async def test_the_listing_and_the_whole_layout_arrive_without_a_screen_layout(monkeypatch):
    events: list[str] = []
    record(monkeypatch, events)
    app = make_app(model=engine.load(residual_chain(BLOCKS)), label="chain")
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        entry_list, graph = app.query_one("#node-options"), app.query_one("#graph")
        await until(pilot, lambda: "listed" in events and "whole layout" in events)
        await settle(app, pilot)
        await pilot.pause(0.3)
        assert graph.canvas.layout is app.layouts[app._layout_key()]  # the whole layout is on screen
        first = min(events.index("listed"), events.index("whole layout"))
        assert events.index("placeholder") < events.index("layout") < first  # the screen was laid out before
        assert "layout" not in events[first:], events
        # The list scrolls the rows listed, in its own box: no horizontal scrollbar takes a row.
        assert entry_list.virtual_size.height == len(entry_list.entries) > entry_list.size.height
        assert entry_list.show_vertical_scrollbar and not entry_list.show_horizontal_scrollbar
        assert entry_list.scrollable_content_region.height == entry_list.size.height
        entry_list.focus()
        await pilot.press("end")  # the new virtual size is scrollable to its last row
        await settle(app, pilot)
        assert int(entry_list.scroll_y) == entry_list.max_scroll_y > 0


async def test_a_scrollbar_coming_or_going_still_lays_out_the_list():
    """The one case where a new virtual size changes the list's content box: laid out, drawn right."""
    app = spec_app()
    async with opened(app) as pilot:
        entry_list = app.query_one("#node-options")
        few = entry_list.entries
        assert not entry_list.show_vertical_scrollbar and len(few) < entry_list.size.height
        many = [Entry(f"t:{k}", f"tensor_{k}", "[1]", None, f"tensor_{k}") for k in range(200)]
        entry_list.set_entries(many)
        await pilot.pause(0.1)
        assert entry_list.show_vertical_scrollbar
        assert entry_list.scrollable_content_region.width == entry_list.size.width - 2
        assert entry_list.render_line(0).text.startswith("  tensor_0")
        entry_list.set_entries(few)
        await pilot.pause(0.1)
        assert not entry_list.show_vertical_scrollbar and entry_list.virtual_size == Size(1, len(few))
        assert entry_list.scrollable_content_region.width == entry_list.size.width


async def test_the_gradients_arriving_fill_their_table_without_a_screen_layout(monkeypatch):
    events: list[str] = []
    record(monkeypatch, events)
    wrap_results = Results.show_gradient

    def show_gradient(self, result, *args, **kwargs):
        events.append("gradients" if result is not None else "no gradients")
        return wrap_results(self, result, *args, **kwargs)
    monkeypatch.setattr(Results, "show_gradient", show_gradient)
    app = spec_app()
    async with opened(app) as pilot:
        table = app.query_one("#gradient-table")
        assert table.row_count == 0
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.pause(0.2)
        assert table.row_count == len(app.session.xs) > 0
        assert "layout" not in events[events.index("gradients"):], events
        shown = [table.render_line(y).text for y in range(table.size.height)]
        assert all(any(x in line for line in shown) for x in app.session.xs), shown


async def test_an_arrow_key_repaints_the_rows_that_change_and_the_screen_is_what_a_full_repaint_draws(monkeypatch):
    """Unscrolled, a cursor move repaints the two boxes' rows in the graph and the two entries in
    the navigator (each pane re-rendered whole would be a third of a key's frame on GPT-2); the picture
    must be exactly what repainting everything gives."""
    from explorer.widgets.entry_list import EntryList
    from explorer.widgets.graph_view import GraphView

    painted: dict[str, list[int]] = {"GraphView": [], "EntryList": []}
    for cls in (GraphView, EntryList):
        original = cls.render_line

        def render_line(self, y, _original=original, _name=cls.__name__):
            painted[_name].append(y)
            return _original(self, y)
        monkeypatch.setattr(cls, "render_line", render_line)
    app = make_app(model=engine.load(residual_chain(BLOCKS)), label="chain")
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        graph, entry_list = app.query_one("#graph"), app.query_one("#node-options")
        await until(pilot, lambda: graph.canvas is not None and graph.canvas.layout is app.layouts.get(app._layout_key()))
        graph.focus()
        await settle(app, pilot)
        await pilot.pause(0.05)
        partial = 0
        for key in ["down"] * 6 + ["up"] * 3:
            offsets = graph.scroll_offset, entry_list.scroll_offset
            for rows in painted.values():
                rows.clear()
            await pilot.press(key)
            await settle(app, pilot)
            await pilot.pause(0.05)
            shown = app.export_screenshot()
            if offsets == (graph.scroll_offset, entry_list.scroll_offset):
                partial += 1
                box_rows = max(n.height for n in graph.canvas.nodes.values())
                assert 0 < len(painted["GraphView"]) <= 2 * box_rows, painted
                assert 0 < len(painted["EntryList"]) <= 2, painted
            for widget in app.screen.query("*"):
                widget.refresh()
            await pilot.pause(0.05)
            repainted = app.export_screenshot()
            assert repainted == shown, f"{key}: the partial repaint left stale rows: {rows_that_differ(shown, repainted)}"
        assert partial >= 3  # the case under test happened


async def test_the_navigator_brings_a_cursor_moved_out_of_its_view_to_the_middle():
    """Following the graph's cursor, a row out of view is centred, so the next moves scroll (and
    repaint) nothing; the list's own keys still scroll it a row at a time."""
    app = make_app(model=engine.load(residual_chain(BLOCKS)), label="chain")
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        entry_list = app.query_one("#node-options")
        await until(pilot, lambda: bool(entry_list.entries))
        await settle(app, pilot)
        height = entry_list.scrollable_content_region.height
        far = next(k for k in range(len(entry_list.entries) // 2, len(entry_list.entries))
                   if entry_list.entries[k].node_index is not None)
        node = entry_list.entries[far].node_index
        assert height < far
        app.move_cursor(node, None, origin="graph")
        await settle(app, pilot)
        row = entry_list.highlighted - int(entry_list.scroll_y)
        assert abs(row - height // 2) <= 1, (row, height)
        entry_list.focus()
        await pilot.press(*["down"] * (height - row))  # past the bottom edge by the list's own keys
        await settle(app, pilot)
        assert entry_list.current - int(entry_list.scroll_y) == height - 1
