"""Node boxes and edge routes in terminal character cells, for drawing with box-drawing characters.

Placement comes from Graphviz (`dot -Tplain`) when the program is installed, else from the
pure-Python layered placement in layered.py; both feed the same assembly: ranks become rows
of boxes three cells high with two free rows between ranks, and every edge is routed
orthogonally — down from a port on the source's bottom border, sideways only in the free rows
(the first free row below each rank), down through a rank only in the column reserved for it
(Graphviz's virtual node, or ours), into a port on the target's top border. The row just above
a target is always vertical, so a renderer can put an arrowhead there.
"""
from __future__ import annotations

import gc
import shutil
import subprocess
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

from ..errors import OnnxGradError
from ..gradient.selection import GradientSpec
from ..run.pacing import pause_point
from .backward import graph_of
from .dot import GraphvizMissingError
from .layered import Placement, isotonic_place, place
from .view import ViewGraph, build_view

NODE_HEIGHT = 3
RANK_GAP = 2  # free rows between ranks: the first carries sideways runs, the second arrowheads
NODE_SEP = 2  # free columns between neighbours in a rank
MAX_LABEL = 28  # wider labels are cut by the renderer; boxes never grow past this
CELL_W_IN, CELL_H_IN = 0.1, 0.2  # a cell's size in inches when Graphviz places the boxes
DOT_TIMEOUT_S = 20.0
# From this many drawn nodes "auto" skips Graphviz: the layered placement is five times faster on
# densenet's 1,746 nodes and a third as wide, and dot runs past its timeout on 12,500.
DOT_MAX_NODES = 400
UNLAID_KINDS = ("needs", "gradient_input")  # edges drawn without a route of their own (see _layout_edges)


@dataclass(frozen=True)
class LayoutNode:
    id: str
    label: str
    x: int  # left column of the box
    y: int  # top row of the box
    width: int
    height: int
    role: str
    op_type: str | None
    node_index: int | None


@dataclass(frozen=True)
class LayoutEdge:
    source: str
    target: str
    points: tuple[tuple[int, int], ...]  # (x, y) cells; consecutive points share x or y
    label: str
    kind: str = "data"  # the ViewEdge kind: data, output, cut, grad, partial
    stats_key: str | None = None  # backward edges: the key of their stats in GraphStats.edges


@dataclass(frozen=True)
class GraphLayout:
    width: int
    height: int
    nodes: tuple[LayoutNode, ...]
    edges: tuple[LayoutEdge, ...]
    engine: str = "layered"  # "dot" or "layered": which placement produced it

    @cached_property
    def by_id(self) -> dict[str, LayoutNode]:
        return {n.id: n for n in self.nodes}

    def node(self, node_id: str) -> LayoutNode:
        return self.by_id[node_id]

    def node_at(self, x: int, y: int) -> LayoutNode | None:
        for n in self.nodes:
            if n.x <= x < n.x + n.width and n.y <= y < n.y + n.height:
                return n
        return None


ENGINES = ("auto", "dot", "layered")
_cache: dict[tuple, tuple[weakref.ref, GraphLayout]] = {}
_cache_lock = threading.Lock()
_CACHE_SIZE = 32


def layout_graph(model, spec: GradientSpec | None = None, view: str = "forward", *,
                 collapse_chains: bool = False, engine: str = "auto") -> GraphLayout:
    """Lay out a view for the terminal; cached per (model, spec, view, collapse_chains, engine).

    engine: "auto" (Graphviz when installed and the view has under DOT_MAX_NODES nodes, else
    layered), "dot" or "layered".
    """
    if engine not in ENGINES:
        raise OnnxGradError(f"unknown layout engine {engine!r}: choose {', '.join(ENGINES)}")
    graph = graph_of(model)
    key = (id(graph), spec, view, collapse_chains, engine)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    with gc_paused():
        laid = layout_view(build_view(graph, spec, view, collapse_chains=collapse_chains, needs_edges=False),
                           engine=engine)
    with _cache_lock:  # the explorer lays out in worker threads
        while len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (weakref.ref(graph), laid)
    return laid


@contextmanager
def gc_paused():
    """The cyclic collector off while a layout (or its canvas index) is built.

    A 12,500-node layout allocates a few hundred thousand small lists and tuples, none of them in
    cycles; with the collector on, each burst of them sets off a scan of the whole heap (the loaded
    model, its views), a third of the time the layout takes. Turned back on only if it was on, so
    layouts in two threads at once still end with it on.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def node_width(label: str) -> int:
    return min(len(label), MAX_LABEL) + 4


def layout_view(view: ViewGraph, engine: str = "auto", widths: list[int] | None = None) -> GraphLayout:
    """`widths`: each node's box width in cells (default: its label's, cut at MAX_LABEL)."""
    ids = [n.id for n in view.nodes]
    widths = widths or [node_width(n.label) for n in view.nodes]
    pairs, labels, kinds = _layout_edges(view)
    index = {node_id: k for k, node_id in enumerate(ids)}
    edges = [(index[s], index[t]) for s, t in pairs]
    placed = None
    if engine == "auto" and len(ids) >= DOT_MAX_NODES:
        engine = "layered"
    if engine in ("auto", "dot") and shutil.which("dot"):
        placed = _dot_placement(view, widths, edges)
    elif engine == "dot":
        raise GraphvizMissingError("the dot layout needs the Graphviz 'dot' program, which is not installed")
    used = "dot"
    if placed is None:
        if engine == "dot":
            raise OnnxGradError("Graphviz dot failed or timed out on this graph; use the layered layout")
        same_rank = [[index[m] for m in group] for group in view.same_rank]
        placed, used = place(widths, edges, same_rank, sep=NODE_SEP), "layered"
    return _assemble(view, widths, edges, labels, kinds, placed, used)


def _layout_edges(view: ViewGraph):
    """One edge per (source, target) pair; parallel edges' tensor names joined in its label.

    Left out: "needs" edges and a Gradient node's inputs in the combined view, which would tie
    the backward cluster under the forward graph instead of beside it.
    """
    known = {n.id for n in view.nodes}
    labels: dict[tuple[str, str], list[str]] = {}
    kinds: dict[tuple[str, str], tuple[str, str | None]] = {}
    for e in view.edges:
        if (e.kind in UNLAID_KINDS or e.source not in known or e.target not in known
                or e.source == e.target):
            continue
        pair = (e.source, e.target)
        names = labels.setdefault(pair, [])
        text = e.tensor or ""
        if text and text not in names:
            names.append(text)
        kinds.setdefault(pair, (e.kind, e.stats_key))
    edges = list(labels)
    return edges, [", ".join(labels[p]) for p in edges], [kinds[p] for p in edges]


def _dot_placement(view: ViewGraph, widths, edges) -> Placement | None:
    """Ranks and centres (in cells) read back from `dot -Tplain`; None if dot fails."""
    try:
        done = subprocess.run(["dot", "-Tplain"], input=_dot_source(view, widths, edges).encode(),
                              capture_output=True, timeout=DOT_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if done.returncode != 0:
        return None
    node_xy, splines = _read_plain(done.stdout.decode(errors="replace"), len(widths))
    if len(node_xy) != len(widths):
        return None
    return _placement_from(node_xy, splines, widths, edges)


def _dot_source(view: ViewGraph, widths, edges) -> str:
    """The graph for dot: fixed-size boxes `widths` cells wide, clusters as subgraphs, the view's same-rank groups."""
    lines = [
        "digraph L {",
        f'graph [rankdir=TB nodesep={NODE_SEP * CELL_W_IN:.3f} ranksep={RANK_GAP * CELL_H_IN:.3f}];',
        f'node [shape=box fixedsize=true label="" height={NODE_HEIGHT * CELL_H_IN:.3f}];',
    ]
    index = {n.id: k for k, n in enumerate(view.nodes)}
    members: dict[str | None, list[int]] = {}
    for k, n in enumerate(view.nodes):
        members.setdefault(n.cluster, []).append(k)
    for cluster, ms in members.items():
        body = " ".join(f"v{m} [width={widths[m] * CELL_W_IN:.3f}];" for m in ms)
        same = "".join(f"{{rank=same; {' '.join(f'v{index[m]}' for m in g)}}}" for g in view.same_rank
                       if cluster is not None and {index[m] for m in g} <= set(ms))
        lines.append(body if cluster is None else
                     f"subgraph {cluster.replace('/', '_').replace(':', '_')} {{ {body} {same} }}")
    lines.extend(f"v{s} -> v{t};" for s, t in edges)
    lines.append("}")
    return "\n".join(lines)


def _read_plain(text: str, count: int):
    """(node_xy, splines) from `dot -Tplain` output: each node's centre in inches, each edge's control points."""
    back = {f"v{k}": k for k in range(count)}
    node_xy: dict[int, tuple[float, float]] = {}
    splines: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "node" and parts[1] in back:
            node_xy[back[parts[1]]] = (float(parts[2]), float(parts[3]))
        elif parts[0] == "edge" and parts[1] in back and parts[2] in back:
            n = int(parts[3])
            pts = [(float(parts[4 + 2 * i]), float(parts[5 + 2 * i])) for i in range(n)]
            splines.setdefault((back[parts[1]], back[parts[2]]), pts)
    return node_xy, splines


def _placement_from(node_xy: dict, splines: dict, widths, edges) -> Placement:
    """Ranks from dot's distinct heights; centres in cells, with a chain of points along each edge
    that spans several ranks, every layer then repaired to whole cells."""
    rank_of_y = {y: r for r, y in enumerate(sorted({round(y, 3) for _, y in node_xy.values()}, reverse=True))}
    rank_y = {r: y for y, r in rank_of_y.items()}
    rank = [rank_of_y[round(node_xy[k][1], 3)] for k in range(len(widths))]
    layers: list[list[int]] = [[] for _ in rank_of_y]
    centre = [node_xy[k][0] / CELL_W_IN for k in range(len(widths))]
    item_widths = list(widths)
    chains: dict[int, list[int]] = {}
    for k, (s, t) in enumerate(edges):
        rs, rt = rank[s], rank[t]
        if rt - rs < 2:
            continue
        curve = _sample(splines.get((s, t)) or [node_xy[s], node_xy[t]])
        chain = chains[k] = []
        for r in range(rs + 1, rt):
            chain.append(len(centre))
            centre.append(_x_at(curve, rank_y[r]) / CELL_W_IN)
            item_widths.append(1)
    for k in range(len(widths)):
        layers[rank[k]].append(k)
    for k, chain in chains.items():
        for r, item in enumerate(chain, rank[edges[k][0]] + 1):
            layers[r].append(item)
    for layer in layers:  # Graphviz spaced them already; this only repairs rounding to cells
        layer.sort(key=centre.__getitem__)
        ws = [item_widths[i] for i in layer]
        lefts = isotonic_place([centre[i] - w / 2 for i, w in zip(layer, ws)], ws, [1.0] * len(ws), 1.0)
        for item, left, w in zip(layer, lefts, ws):
            centre[item] = left + w / 2
    return Placement(rank, centre[:len(widths)], {k: [centre[v] for v in chain] for k, chain in chains.items()})


def _sample(points: list[tuple[float, float]], steps: int = 6) -> list[tuple[float, float]]:
    """A polyline through a piecewise cubic Bézier (Graphviz's 3n+1 control points)."""
    if len(points) < 4:
        return points
    out = [points[0]]
    for i in range(0, len(points) - 3, 3):
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = points[i:i + 4]
        for s in range(1, steps + 1):
            t = s / steps
            a, b, c, d = (1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t ** 3
            out.append((a * x0 + b * x1 + c * x2 + d * x3, a * y0 + b * y1 + c * y2 + d * y3))
    return out


def _x_at(curve: list[tuple[float, float]], y: float) -> float:
    for (xa, ya), (xb, yb) in zip(curve, curve[1:]):
        if min(ya, yb) <= y <= max(ya, yb):
            return xa if ya == yb else xa + (xb - xa) * (y - ya) / (yb - ya)
    return min(curve, key=lambda p: abs(p[1] - y))[0]


def _assemble(view, widths, edges, labels, kinds, placed: Placement, engine) -> GraphLayout:
    pitch = NODE_HEIGHT + RANK_GAP
    rank = placed.rank
    left = [round(c - w / 2) for c, w in zip(placed.centre, widths)]
    chain_left = {k: [round(c - 0.5) for c in cs] for k, cs in placed.chains.items() if cs}
    shift = -min([*left, *(x for xs in chain_left.values() for x in xs)], default=0)
    if shift:
        left = [x + shift for x in left]
        chain_left = {k: [x + shift for x in xs] for k, xs in chain_left.items()}
    mid = [x + w / 2 for x, w in zip(left, widths)]
    # Ports are ordered by where each edge goes next: its first (or last) virtual item, else
    # the box at its other end.
    outs: list[list[tuple[float, int]]] = [[] for _ in widths]
    ins: list[list[tuple[float, int]]] = [[] for _ in widths]
    for k, (s, t) in enumerate(edges):
        xs = chain_left.get(k)
        outs[s].append((xs[0] if xs else mid[t], k))
        ins[t].append((xs[-1] if xs else mid[s], k))
    out_port = _spread(outs, left, widths, len(edges))
    in_port = _spread(ins, left, widths, len(edges))

    ids = [n.id for n in view.nodes]
    routed = []
    for k, (s, t) in enumerate(edges):
        if not k & 127:
            pause_point()
        px, qx = out_port[k], in_port[k]
        rs, rt = rank[s], rank[t]
        sy, ty = rs * pitch + NODE_HEIGHT - 1, rt * pitch
        if rt == rs + 1 and k not in chain_left:  # the common short edge, already in its simplest form
            points = ((px, sy), (qx, ty)) if px == qx else ((px, sy), (px, sy + 1), (qx, sy + 1), (qx, ty))
        elif rt > rs:
            points = [(px, sy)]
            x = px
            for step, nx in enumerate(chain_left.get(k, []) + [qx]):
                run = (rs + step) * pitch + NODE_HEIGHT
                points += [(x, run), (nx, run)]
                x = nx
            points.append((qx, ty))
            points = _simplify(points)
        else:  # flat or upward: never produced by a DAG, routed plainly all the same
            run = rs * pitch + NODE_HEIGHT
            points = _simplify([(px, sy), (px, run), (qx, run), (qx, ty + NODE_HEIGHT - 1)])
        routed.append(LayoutEdge(ids[s], ids[t], points, labels[k], *kinds[k]))
    nodes = tuple(
        LayoutNode(n.id, n.label, x, r * pitch, w, NODE_HEIGHT, n.role, n.op_type, n.node_index)
        for n, x, r, w in zip(view.nodes, left, rank, widths)
    )
    width = max([x + w for x, w in zip(left, widths)] + [x + 1 for xs in chain_left.values() for x in xs],
                default=0)
    height = (max(rank, default=-1) + 1) * pitch - RANK_GAP if rank else 0
    return GraphLayout(width, max(height, 0), nodes, tuple(routed), engine)


def _spread(ends: list[list[tuple[float, int]]], left, widths, n_edges) -> list[int]:
    """Ports along each box border, inside its corners, in the order the edges leave or arrive.

    ends[node]: (x the edge heads for, edge index) per edge at that border.
    """
    port = [0] * n_edges
    for node, here in enumerate(ends):
        if not node & 511:
            pause_point()
        if not here:
            continue
        x, inner, n = left[node] + 1, max(widths[node] - 2, 1), len(here)
        if n == 1:
            port[here[0][1]] = x + inner // 2
            continue
        here.sort(key=_first)  # stable: ties keep the edge order
        for j, (_, e) in enumerate(here):
            port[e] = x + ((2 * j + 1) * inner) // (2 * n)
    return port


def _first(pair):
    return pair[0]


def _simplify(points):
    out = []
    for p in points:
        if out and out[-1] == p:
            continue
        if len(out) >= 2 and (out[-2][0] == out[-1][0] == p[0] or out[-2][1] == out[-1][1] == p[1]):
            out[-1] = p
            continue
        out.append(p)
    return tuple(out)
