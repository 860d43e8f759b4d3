"""The neighbourhood of one node laid out on its own: a drawing in milliseconds while the whole
graph is still being laid out (10,001 nodes take seconds in pure Python).

`layout_near(model, spec, view, node_index=, tensor=)` keeps the `limit` nodes nearest the
centre (breadth-first over edges in both directions, so the centre's producers and consumers
come first), lays out only those, and says which kept boxes have edges leaving the
neighbourhood (its `frontier`: a viewer moving onto one asks for the neighbourhood there).
Box ids are those of the full layout of the same view, so a selection survives the swap.

The forward view is cut from the graph index before any view is built (the 10,001-node model's
full forward view alone costs 0.2 s); the backward and combined views are cut from their full
view, built once per (graph, spec, view) and kept while the graph lives.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass

from ..gradient.selection import GradientSpec
from .backward import graph_of
from .layout import GraphLayout, layout_view
from .view import SMALL_MODEL_NODES, ViewGraph, build_view
from .view import _tensor_roles as tensor_roles

LOCAL_NODES = 120  # a few screens of boxes around the centre, laid out in about 20 ms


@dataclass(frozen=True)
class LocalLayout:
    layout: GraphLayout
    frontier: frozenset[str]  # ids of kept boxes with an edge to a box left out
    shown: int  # boxes kept
    total: int  # boxes of the whole view

    @property
    def complete(self) -> bool:
        return self.shown == self.total


def layout_near(model, spec: GradientSpec | None = None, view: str = "forward", *, node_index: int | None = None,
                tensor: str | None = None, limit: int = LOCAL_NODES) -> LocalLayout:
    """The `limit` boxes of `view` nearest the node `node_index` (else the tensor `tensor`, else the
    view's first boxes), laid out with the layered placement."""
    graph = graph_of(model)
    if view == "forward":
        return _forward_near(graph, spec, node_index, tensor, limit)
    full, adjacency = _full_view(graph, spec, view)
    keep = _nearest(_view_starts(full, adjacency, node_index, tensor), adjacency, limit)
    kept = set(keep)
    sub = ViewGraph(full.view, tuple(n for n in full.nodes if n.id in kept),
                    tuple(e for e in full.edges if e.source in kept and e.target in kept),
                    tuple(c for c in full.clusters if any(n.cluster == c[0] for n in full.nodes if n.id in kept)),
                    full.small, tuple(g for g in (tuple(i for i in grp if i in kept) for grp in full.same_rank)
                                      if len(g) > 1))
    frontier = frozenset(i for i in keep if any(j not in kept for j in adjacency.get(i, ())))
    return LocalLayout(layout_view(sub, engine="layered"), frontier, len(sub.nodes), len(full.nodes))


def _forward_near(graph, spec, node_index, tensor, limit) -> LocalLayout:
    """Breadth-first over the forward view's boxes and edges as build_view makes them, read off
    the graph index: operators "n<i>", and "t:<name>" for the tensors drawn as boxes."""
    roles = tensor_roles(graph, spec, len(graph.nodes) <= SMALL_MODEL_NODES)

    def neighbours(box):
        if box.startswith("t:"):
            t = box[2:]
            if t in graph.producer:
                yield f"n{graph.producer[t]}"
            for j in graph.consumers.get(t, ()):
                yield f"n{j}"
            return
        node = graph.nodes[int(box[1:])]
        for t in node.input:
            if t in roles:
                yield f"t:{t}"
            elif t in graph.producer:
                yield f"n{graph.producer[t]}"
        for t in node.output:
            if t in roles:
                yield f"t:{t}"
            elif t:
                for j in graph.consumers.get(t, ()):
                    yield f"n{j}"

    if node_index is not None and 0 <= node_index < len(graph.nodes):
        starts = [f"n{node_index}"]
    elif tensor in roles:
        starts = [f"t:{tensor}"]
    elif tensor in graph.producer:
        starts = [f"n{graph.producer[tensor]}"]
    elif tensor in graph.consumers:
        starts = [f"n{j}" for j in graph.consumers[tensor]]
    else:
        starts = [f"t:{graph.inputs[0]}"] if graph.inputs and graph.inputs[0] in roles else ["n0"] if graph.nodes else []
    keep = _nearest(starts, None, limit, neighbours)
    kept = set(keep)
    sub = build_view(graph, spec, "forward", needs_edges=False, nodes=kept)
    frontier = frozenset(b for b in keep if any(j not in kept for j in neighbours(b)))
    return LocalLayout(layout_view(sub, engine="layered"), frontier, len(sub.nodes), len(graph.nodes) + len(roles))


def _nearest(starts, adjacency, limit, neighbours=None) -> list:
    """Up to `limit` items breadth-first from `starts`, nearest first."""
    neighbours = neighbours or (lambda i: adjacency.get(i, ()))
    seen = dict.fromkeys(starts)
    queue = deque(seen)
    while queue and len(seen) < limit:
        for j in neighbours(queue.popleft()):
            if j not in seen:
                seen[j] = None
                queue.append(j)
                if len(seen) >= limit:
                    break
    return list(seen)[:limit]


def _view_starts(full: ViewGraph, adjacency, node_index, tensor) -> list[str]:
    """The boxes standing for the node (forward node or backward twin), else the tensor, else the
    boxes nothing points into (the top of the drawing)."""
    if node_index is not None:
        ids = [n.id for n in full.nodes if n.node_index == node_index]
        if ids:
            return ids
    if tensor is not None:
        ids = [n.id for n in full.nodes if n.node_index is None and (n.id == f"t:{tensor}" or
                                                                     n.id.endswith(f"dx:{tensor}"))]
        if ids:
            return ids
    targets = {e.target for e in full.edges}
    return [n.id for n in full.nodes if n.id not in targets][:1] or [n.id for n in full.nodes[:1]]


_views: dict[tuple, tuple[weakref.ref, ViewGraph, dict]] = {}
_views_lock = threading.Lock()
_VIEWS_KEPT = 4


def _full_view(graph, spec, view) -> tuple[ViewGraph, dict[str, list[str]]]:
    key = (id(graph), spec, view)
    with _views_lock:
        hit = _views.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1], hit[2]
    full = build_view(graph, spec, view, needs_edges=False)
    adjacency: dict[str, list[str]] = {}
    for e in full.edges:
        if e.kind in ("needs", "gradient_input") or e.source == e.target:
            continue
        adjacency.setdefault(e.source, []).append(e.target)
        adjacency.setdefault(e.target, []).append(e.source)
    with _views_lock:  # built in worker threads too
        while len(_views) >= _VIEWS_KEPT:
            _views.pop(next(iter(_views)))
        _views[key] = (weakref.ref(graph), full, adjacency)
    return full, adjacency
