"""Terminal layout: boxes never overlap, edges are orthogonal and stay out of boxes, fast enough."""
from __future__ import annotations

import os
import pathlib
import shutil
import time

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.examples import spec_conv_gemm
from engine.graphs import Canvas, layout_graph, render_text
from engine.graphs.layout import NODE_HEIGHT
from engine.modelfile.reader import read_graph
from tests.graphs.test_backward import fan_out
from tests.graphs.test_diagrams import grad_wrt_h, second_order

ENGINES = ["layered"] + (["dot"] if shutil.which("dot") else [])
SNAPSHOTS = pathlib.Path(__file__).parent / "snapshots_graphs"


def check_layout(layout) -> None:
    boxes = {n.id: n for n in layout.nodes}
    assert len(boxes) == len(layout.nodes)
    occupied: dict[tuple[int, int], str] = {}
    for n in layout.nodes:
        assert n.x >= 0 and n.y >= 0 and n.x + n.width <= layout.width and n.y + n.height <= layout.height
        assert n.height == NODE_HEIGHT and n.width >= len(n.label[:28]) + 4
        for y in range(n.y, n.y + n.height):
            row = range(n.x, n.x + n.width)
            for x in row:
                assert (x, y) not in occupied, f"{n.id} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = n.id
    for e in layout.edges:
        src, dst = boxes[e.source], boxes[e.target]
        (x0, y0), (x1, y1) = e.points[0], e.points[-1]
        assert y0 == src.y + src.height - 1 and src.x < x0 < src.x + src.width - 1  # bottom border, not a corner
        assert y1 == dst.y and dst.x < x1 < dst.x + dst.width - 1  # top border
        cells = []
        for (ax, ay), (bx, by) in zip(e.points, e.points[1:]):
            assert ax == bx or ay == by, f"{e.source}->{e.target} has a diagonal step"
            if ax == bx:
                cells += [(ax, y) for y in range(min(ay, by), max(ay, by) + 1)]
            else:
                cells += [(x, ay) for x in range(min(ax, bx), max(ax, bx) + 1)]
        inner = set(cells) - {e.points[0], e.points[-1]}
        hits = [occupied[c] for c in inner if c in occupied]
        assert not hits, f"edge {e.source}->{e.target} runs through {hits[0]}"


MODELS = {
    "conv_gemm": (spec_conv_gemm, [(None, "forward"), (None, "backward"), (None, "combined"),
                                   (("Y", ["W", "Z"], ["X"]), "combined")]),
    "grad_wrt_h": (grad_wrt_h, [(("Y", ["H", "Z"], []), "forward"), (None, "combined")]),
    "second_order": (second_order, [(None, "forward"), (None, "combined")]),
    "fan_out": (None, [(("Y", ["A", "B"], []), "combined"), (("Y", ["A", "B"], []), "backward")]),
}


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_layouts_are_well_formed(name, engine_name):
    build, views = MODELS[name]
    model = fan_out() if build is None else engine.load(build())
    for selection, view in views:
        spec = model.selection(*selection) if selection else None
        layout = layout_graph(model, spec, view, engine=engine_name)
        assert layout.engine == engine_name
        check_layout(layout)
        assert {n.role for n in layout.nodes} <= {"x", "z", "y", "active", "inactive", "input", "output",
                                                 "gradient", "backward", "accumulate", "seed", "dx"}


def test_layout_is_cached_and_roles_follow_the_selection():
    model = engine.load(spec_conv_gemm())
    spec = model.selection("Y", ["W", "Z"], ["X"])
    first = layout_graph(model, spec, "forward", engine="layered")
    assert layout_graph(model, spec, "forward", engine="layered") is first
    roles = {n.label: n.role for n in first.nodes}
    assert (roles["W"], roles["Z"], roles["X"], roles["Y"]) == ("x", "x", "z", "y")
    back = layout_graph(model, spec, "backward", engine="layered")
    ordered = sorted(back.nodes, key=lambda n: n.y)
    assert ordered[0].role == "seed" and {n.role for n in ordered[-2:]} == {"dx"}  # dx share the bottom row


def test_terminal_rendering_snapshot():
    model = fan_out()
    layout = layout_graph(model, model.selection("Y", ["A", "B"]), "backward", engine="layered")
    text = render_text(layout)
    path = SNAPSHOTS / "fan_out_backward_layered.txt"
    if os.environ.get("ONNXGRAD_UPDATE_SNAPSHOTS"):
        path.write_text(text + "\n", encoding="utf-8")
    assert text + "\n" == path.read_text(encoding="utf-8")
    assert "Σ dP" in text and "▼" in text and "┴" in text


@settings(max_examples=40, deadline=None)
@given(st.integers(-5, 60), st.integers(-5, 40), st.integers(1, 50), st.integers(1, 30))
def test_a_region_is_the_same_as_cutting_the_whole_picture(x, y, width, height):
    layout = layout_graph(engine.load(second_order()), None, "combined", engine="layered")
    canvas = Canvas(layout)
    whole = canvas.lines(-5, -5, layout.width + 80, layout.height + 60)
    part = canvas.lines(x, y, width, height)
    assert part == [row[x + 5: x + 5 + width] for row in whole[y + 5: y + 5 + height]]
    for row in canvas.region(x, y, width, height):
        assert all(s.tag is None or s.tag.startswith("edge:") or s.tag in {n.role for n in layout.nodes}
                   for s in row)


def test_collapse_chains_folds_linear_runs():
    model = engine.load(spec_conv_gemm(with_gradient=False))
    plain = layout_graph(model, None, "forward", engine="layered")
    folded = layout_graph(model, None, "forward", collapse_chains=True, engine="layered")
    assert len(folded.nodes) == len(plain.nodes) - 2
    (chain,) = [n for n in folded.nodes if n.op_type == "chain"]
    assert chain.label == "Conv … Gemm ×3"
    check_layout(folded)


@pytest.fixture(scope="module")
def densenet():
    path = pathlib.Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light/light_densenet121.onnx"
    return read_graph(path)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_densenet_layout_is_well_formed_and_fast(densenet, engine_name):
    start = time.perf_counter()
    layout = layout_graph(densenet, None, "forward", engine=engine_name)
    elapsed = time.perf_counter() - start
    assert len(layout.nodes) >= 1746
    assert elapsed < 20, f"{engine_name} layout took {elapsed:.1f} s (budget 2 s; see benchmarks/bench_layout.py)"
    check_layout(layout)
    canvas = Canvas(layout)
    start = time.perf_counter()
    for k in range(20):
        canvas.region(k * 7, layout.height // 2 + k * 3, 160, 50)
    assert (time.perf_counter() - start) / 20 < 0.1  # a viewport repaint fits a key press


def test_auto_falls_back_to_layered_without_graphviz(monkeypatch):
    from engine.graphs import GraphvizMissingError
    from engine.graphs import layout as layout_module

    monkeypatch.setattr(layout_module.shutil, "which", lambda name: None)
    model = engine.load(spec_conv_gemm())
    assert layout_graph(model, None, "backward", engine="auto").engine == "layered"
    with pytest.raises(GraphvizMissingError, match="needs the Graphviz 'dot' program"):
        layout_graph(model, None, "backward", engine="dot")


def test_auto_takes_the_layered_placement_for_big_views():
    from engine.graphs.layout import DOT_MAX_NODES

    from ..big_models import residual_chain

    model = engine.load(residual_chain(DOT_MAX_NODES // 4))
    assert layout_graph(model, None, "forward", engine="auto").engine == "layered"
    assert layout_graph(engine.load(spec_conv_gemm()), None, "forward", engine="auto").engine == (
        "dot" if shutil.which("dot") else "layered")


@st.composite
def dags(draw):
    """Random DAGs (edges from lower to higher index), node widths, and maybe a same-rank group."""
    n = draw(st.integers(1, 40))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})
    widths = draw(st.lists(st.integers(5, 32), min_size=n, max_size=n))
    sinks = [v for v in range(n) if all(s != v for s, _ in edges)]
    group = draw(st.lists(st.sampled_from(sinks), unique=True, max_size=3)) if len(sinks) > 1 else []
    return widths, edges, [group] if len(group) > 1 else []


@settings(max_examples=60, deadline=None)
@given(dags())
def test_layered_placement_ranks_edges_downward_and_keeps_boxes_apart(graph):
    from engine.graphs.layered import place

    widths, edges, same_rank = graph
    placed = place(widths, edges, same_rank, sep=2)
    assert place(widths, edges, same_rank, sep=2) == placed  # deterministic
    for k, (s, t) in enumerate(edges):
        assert placed.rank[t] > placed.rank[s]
        assert len(placed.chains.get(k, [])) == placed.rank[t] - placed.rank[s] - 1  # one virtual item per rank crossed
    for group in same_rank:
        assert len({placed.rank[v] for v in group}) == 1
    by_rank: dict[int, list[tuple[float, float]]] = {}
    for v, (r, c) in enumerate(zip(placed.rank, placed.centre)):
        by_rank.setdefault(r, []).append((c - widths[v] / 2, c + widths[v] / 2))
    for k, chain in placed.chains.items():
        for r, c in enumerate(chain, placed.rank[edges[k][0]] + 1):
            by_rank.setdefault(r, []).append((c - 0.5, c + 0.5))
    for spans in by_rank.values():
        spans.sort()
        for (_, right), (left, _) in zip(spans, spans[1:]):
            assert left >= right + 2 - 1e-9  # the separation holds between every neighbour pair


@settings(max_examples=40, deadline=None)
@given(dags())
def test_layered_layout_of_any_dag_is_well_formed_and_edges_run_down(graph):
    from engine.graphs.layout import layout_view
    from engine.graphs.view import ViewEdge, ViewGraph, ViewNode

    widths, edges, same_rank = graph
    nodes = tuple(ViewNode(f"v{k}", "x" * (w - 4), "active", "Op", k) for k, w in enumerate(widths))
    view = ViewGraph("forward", nodes, tuple(ViewEdge(f"v{s}", f"v{t}") for s, t in edges),
                     same_rank=tuple(tuple(f"v{v}" for v in g) for g in same_rank))
    layout = layout_view(view, "layered")
    check_layout(layout)
    assert [n.id for n in layout.nodes] == [n.id for n in nodes] and len(layout.edges) == len(edges)
    cells = {(n.x, n.y) for n in layout.nodes}
    assert len(cells) == len(nodes)  # every node its own cell
    for e in layout.edges:
        ys = [y for _, y in e.points]
        assert ys == sorted(ys) and ys[-1] > ys[0], f"{e.source}->{e.target} does not run downward"
    assert layout_view(view, "layered") == layout


@pytest.mark.parametrize("collector_on", [True, False])
def test_a_layout_leaves_the_garbage_collector_as_it_found_it(collector_on):
    import gc

    from ..big_models import residual_chain

    model = engine.load(residual_chain(120))
    (gc.enable if collector_on else gc.disable)()
    try:
        layout = layout_graph(model, model.selection("loss", ["input"]), "backward", engine="layered")
        assert gc.isenabled() is collector_on
    finally:
        gc.enable()
    check_layout(layout)
    nodes = {n.id: n for n in layout.nodes}
    assert all(nodes[e.source].y < nodes[e.target].y for e in layout.edges)
