"""`layout_near`: the neighbourhood of a node, laid out alone, is a faithful piece of the whole view:
the same box ids, roles and edges among the kept boxes, the nearest boxes kept first, and a
frontier that names exactly the kept boxes with an edge to a box left out."""
from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine import examples
from engine.graphs.view import build_view

from ..big_models import residual_chain, wide_fan

MODELS = {"chain": lambda: engine.load(residual_chain(40)), "fan": lambda: engine.load(wide_fan(30)),
          "spec": lambda: engine.load(examples.spec_conv_gemm())}
_loaded: dict = {}


def model(name):
    if name not in _loaded:
        _loaded[name] = MODELS[name]()
    return _loaded[name]


def adjacency(view) -> dict[str, set[str]]:
    adj: dict[str, set[str]] = {n.id: set() for n in view.nodes}
    for e in view.edges:
        if e.kind not in ("needs", "gradient_input") and e.source != e.target:
            adj[e.source].add(e.target)
            adj[e.target].add(e.source)
    return adj


def distances(adj, starts) -> dict[str, int]:
    dist = {s: 0 for s in starts}
    queue = deque(starts)
    while queue:
        a = queue.popleft()
        for b in adj[a]:
            if b not in dist:
                dist[b] = dist[a] + 1
                queue.append(b)
    return dist


def assert_faithful(m, spec, view, local, starts, limit) -> None:
    full = build_view(m, spec, view, needs_edges=False)
    by_id = {n.id: n for n in full.nodes}
    adj = adjacency(full)
    kept = {n.id for n in local.layout.nodes}
    assert kept <= set(by_id) and len(kept) == local.shown <= max(limit, len(starts) + 1)
    assert local.total == len(full.nodes)
    for n in local.layout.nodes:  # the same box as in the whole drawing, not a look-alike
        assert (n.label, n.role, n.node_index) == (by_id[n.id].label, by_id[n.id].role, by_id[n.id].node_index)
    pairs = {(e.source, e.target) for e in local.layout.edges}
    assert pairs == {(e.source, e.target) for e in full.edges if e.source in kept and e.target in kept
                     and e.kind not in ("needs", "gradient_input") and e.source != e.target}
    assert local.frontier == {i for i in kept if adj[i] - kept}
    dist = distances(adj, starts)
    # Nearest first: nothing left out is closer to the centre than something kept (ties aside).
    farthest_kept = max(dist.get(i, 0) for i in kept)
    assert all(d >= farthest_kept for i, d in dist.items() if i not in kept)
    assert local.complete == (kept == set(by_id))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(MODELS)), pick=st.integers(0, 10_000), limit=st.integers(1, 60))
def test_forward_neighbourhood_is_a_faithful_piece_of_the_whole_view(name, pick, limit):
    m = model(name)
    i = pick % len(m.graph.nodes)
    local = engine.layout_near(m, None, "forward", node_index=i, limit=limit)
    assert f"n{i}" in {n.id for n in local.layout.nodes}
    assert_faithful(m, None, "forward", local, [f"n{i}"], limit)


@pytest.mark.parametrize("view", ["backward", "combined"])
@pytest.mark.parametrize("pick", [0, 37, 80, 160])
def test_backward_and_combined_neighbourhoods_are_faithful_too(view, pick):
    m = model("chain")
    spec = m.selection("loss", ["input"])
    local = engine.layout_near(m, spec, view, node_index=pick, limit=50)
    starts = [n.id for n in build_view(m, spec, view, needs_edges=False).nodes if n.node_index == pick]
    assert starts and set(starts) <= {n.id for n in local.layout.nodes}
    assert_faithful(m, spec, view, local, starts, 50)


def test_a_tensor_centre_and_a_whole_small_graph():
    m = model("chain")
    local = engine.layout_near(m, None, "forward", tensor="input", limit=10)
    ids = {n.id for n in local.layout.nodes}
    assert "t:input" in ids and {"n0", "n3"} <= ids  # the input's two readers: the first conv and add
    small = model("spec")
    whole = engine.layout_near(small, None, "forward", node_index=0)
    assert whole.complete and not whole.frontier
    assert {n.id for n in whole.layout.nodes} == {n.id for n in engine.layout_graph(small, engine="layered").nodes}


def test_the_forward_neighbourhood_of_the_10001_node_model_takes_milliseconds():
    import time

    m = engine.load(residual_chain(2500))
    t = time.perf_counter()
    local = engine.layout_near(m, None, "forward", node_index=5000)
    assert time.perf_counter() - t < 1.0  # a ceiling against a freeze (about 15 ms here), not a benchmark
    assert local.total == 10_003 and 100 <= local.shown <= 121 and local.frontier
