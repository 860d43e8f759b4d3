"""The graph pane is never blank: at open, after a view switch, a search jump and a resize, the
viewport holds the selected box (issue 10, item 4). Asserted on state: scroll offset against the
box's cells, and the drawn rows."""
from __future__ import annotations

import engine
from explorer.app import make_app

from ..big_models import wide_fan
from .conftest import SIZE, settle, started


def wide_app():
    app = make_app(model=engine.load(wide_fan(40)), label="wide_fan")
    app.raise_errors = True
    return app


def assert_selection_in_view(graph) -> None:
    assert graph.canvas is not None and graph.selected is not None
    box = graph.canvas.nodes[graph.selected]
    x, y = int(graph.scroll_x), int(graph.scroll_y)
    w, h = graph.scrollable_content_region.size
    assert x <= box.x and box.x + box.width <= x + w, (box, (x, w))
    assert y <= box.y and box.y + box.height <= y + h, (box, (y, h))
    shown = graph.canvas.lines(x, y, w, h)
    assert box.label.split("\n")[0] in "\n".join(shown)  # drawn, not just scrolled to


async def test_a_wide_graph_opens_scrolled_to_the_selection():
    app = wide_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        graph = app.query_one("#graph")
        assert graph.virtual_size.width > 3 * graph.size.width  # the premise: far wider than the pane
        box = graph.canvas.nodes[graph.selected]
        assert box.x > graph.size.width  # the input's box is not in the top-left corner
        assert app.cursor == (None, "input")
        assert_selection_in_view(graph)


async def test_view_switch_search_jump_and_resize_keep_the_selection_in_view():
    app = wide_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        graph = app.query_one("#graph")
        app.session.set_y("loss")
        app.session.toggle_x("input")
        app.selection_changed()
        await pilot.press("g")  # backward
        await started(app, pilot)
        assert app.session.view == "backward" and graph.canvas.layout.nodes
        assert_selection_in_view(graph)
        await pilot.press("g", "g")  # combined, then forward again
        await started(app, pilot)
        assert app.session.view == "forward"
        assert_selection_in_view(graph)
        await pilot.press("slash", *"branch37/relu", "enter")
        await settle(app, pilot)
        assert app.cursor[0] == app.session.graph.node_names.index("branch37/relu")
        assert graph.canvas.nodes[graph.selected].node_index == app.cursor[0]
        assert_selection_in_view(graph)
        for size in ((200, 50), (110, 30)):  # at 80 columns the panes leave the graph none (item 13)
            await pilot.resize_terminal(*size)
            await settle(app, pilot)
            assert_selection_in_view(graph)


def brute_force_nearest(layout, cur, dx, dy):
    """The rule as first written: every box scored, the least score wins (ties: the smaller id)."""
    cx, cy = cur.x + cur.width / 2, cur.y + cur.height / 2
    scored = []
    for n in layout.nodes:
        ox, oy = n.x + n.width / 2 - cx, n.y + n.height / 2 - cy
        along, across = (ox * dx, abs(oy)) if dx else (oy * dy, abs(ox))
        if n.id != cur.id and along > 0:
            scored.append((along + 2.5 * across, n.id))
    return min(scored)[1] if scored else None


def test_arrow_moves_walk_nearby_rows_only_and_agree_with_scoring_every_box():
    from engine.graphs import Canvas
    from explorer.widgets.graph_view import GraphView

    from ..big_models import residual_chain

    for model, view in ((wide_fan(12), "forward"), (residual_chain(6), "forward"), (residual_chain(6), "backward")):
        m = engine.load(model)
        spec = m.selection("loss", ["input"]) if view == "backward" else None
        layout = engine.layout_graph(m, spec, view, engine="layered")
        graph = GraphView()
        graph.canvas = Canvas(layout)
        for cur in layout.nodes:
            for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                got = graph.nearest(cur, dx, dy)
                assert (got.id if got else None) == brute_force_nearest(layout, cur, dx, dy), (cur.id, dx, dy)


async def test_a_cursor_on_something_the_view_draws_no_box_for_leaves_no_box_selected():
    """In the backward view a graph input outside xs has no box: the box of the node the cursor
    was on before must not stay selected, as if it were the cursor."""
    from .conftest import spec_app

    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        graph, g = app.query_one("#graph"), app.session.graph
        app.session.set_y(app.session.model.outputs[0])
        app.session.toggle_x(next(iter(g.initializers)))
        app.selection_changed()
        await pilot.press("g")  # backward
        await started(app, pilot)
        assert app.session.view == "backward"
        boxless = [t for t in (*g.inputs, *g.initializers) if not app.boxes_for(None, t)]
        with_box = next(i for i in range(len(g.nodes)) if app.boxes_for(i, None))
        assert boxless, "the premise: something this view draws no box for"
        app.move_cursor(with_box, None)
        await settle(app, pilot)
        assert graph.selected is not None
        app.move_cursor(None, boxless[0])
        await settle(app, pilot)
        assert app.cursor == (None, boxless[0]) and graph.selected is None
        app.move_cursor(with_box, None)
        await settle(app, pilot)
        assert graph.canvas.nodes[graph.selected].node_index == with_box
