"""A view written to a file: Graphviz dot lays out small graphs; big ones are placed by onnxgrad's own
layered layout (layout.py) and Graphviz only draws them, with `neato -n2`.

dot lays out a few hundred nodes in a second, but transformers defeat it: the attention mask and the
residual stream are edges across every layer, and dot had not finished GPT-2 124M's combined view
(2,348 nodes) after 200 s. From PLACED_FROM_NODES nodes, or when dot runs past DOT_WAIT_S, the
boxes are placed and the edges routed (orthogonally, as in the terminal) by the layered layout, with
widths that fit the labels, and Graphviz is handed every position: nodes with `pos`, edges as
straight-segment splines in their `pos`, clusters with their `bb`. The styles are dot's (dot.py):
both drawings read the same.
"""
from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import replace
from typing import Callable

from ..errors import OnnxGradError
from ..gradient.selection import GradientSpec
from .dot import (
    CLUSTER_ATTRS,
    EDGE_ATTRS,
    GRAPH_ATTRS,
    NODE_ATTRS,
    GraphvizMissingError,
    GraphvizTimeoutError,
    checked_output,
    edge_attrs,
    node_attrs,
    node_label,
    render,
    view_to_dot,
)
from .layout import UNLAID_KINDS, GraphLayout, layout_view
from .view import ViewGraph, build_view

PLACED_FROM_NODES = 400  # dot below (0.4-1 s on the light models' 400-900-node chains), placed from here
DOT_WAIT_S = 20.0  # a smaller graph dot has not laid out by then is placed instead
CELL_W_PT, CELL_H_PT = 7.2, 12.0  # a layout cell, in points
CHAR_CELLS = 0.8  # cells per character of a 10 pt Helvetica label (about 5.6 pt)
ROUND_SHAPES = ("ellipse", "circle", "house", "invhouse")  # need room beside their text
ISLAND_GAP = 8  # cells between the forward graph and a backward cluster set beside it
QUOTED_MAX = 8_000  # Graphviz refuses a quoted string over 16,384 characters: longer ones are joined with +


def render_graph(model, path, spec: GradientSpec | None = None, view: str = "forward", stats=None, *,
                 collapse_chains: bool = False, progress: Callable[[str], None] | None = None) -> str:
    """Draw a model's view into `path` (.dot/.gv, .svg or .png); returns "dot" or "layered" (see render_view)."""
    drawn = build_view(model, spec, view, stats, collapse_chains=collapse_chains)
    return render_view(drawn, path, progress=progress)


def render_view(view: ViewGraph, path, *, progress: Callable[[str], None] | None = None,
                timeout: float = 300) -> str:
    """Write `view` at `path`: .dot/.gv as DOT text, .svg/.png through Graphviz. Returns who laid it
    out: "dot", or "layered" (placed here, drawn by `neato -n2`). `progress(stage)` names each stage."""
    path, fmt = checked_output(path)
    say = progress or (lambda stage: None)
    if fmt in ("dot", "gv") or len(view.nodes) < PLACED_FROM_NODES:
        say(f"laying out {len(view.nodes):,} nodes with Graphviz dot")
        try:
            render(view_to_dot(view), path, timeout=timeout if fmt in ("dot", "gv") else min(timeout, DOT_WAIT_S))
            return "dot"
        except GraphvizTimeoutError:
            pass
    say(f"laying out {len(view.nodes):,} nodes (onnxgrad's layered placement)")
    layout = placed_layout(view)
    say(f"drawing {len(view.nodes):,} nodes with Graphviz neato -n2")
    _run_graphviz("neato", ["-n2", f"-T{fmt}", "-o", path], placed_dot(view, layout), timeout)
    return "layered"


def _run_graphviz(name: str, args: list[str], source: str, timeout: float) -> None:
    program = shutil.which(name)
    if program is None:
        raise GraphvizMissingError(f"drawing a big graph needs Graphviz's '{name}' program, which is not installed "
                                   "(install graphviz, or write a .dot or .txt file instead)")
    try:
        done = subprocess.run([program, *args], input=source.encode("utf-8"), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GraphvizTimeoutError(f"Graphviz {name} took longer than {timeout:.0f} s on this graph") from None
    if done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise OnnxGradError(f"Graphviz {name} failed: {first}")


def placed_layout(view: ViewGraph) -> GraphLayout:
    """The layered layout with label-wide boxes; a cluster no routed edge enters (the combined view's
    backward graph) is laid out on its own and set beside the rest, not interleaved with it."""
    widths = placed_widths(view)
    parts = _islands(view)
    if len(parts) == 1:
        return layout_view(view, engine="layered", widths=widths)
    nodes, edges, left, height = [], [], 0, 0
    for part in parts:
        keep = {view.nodes[i].id for i in part}
        sub = replace(view, nodes=tuple(view.nodes[i] for i in part),
                      edges=tuple(e for e in view.edges if e.source in keep and e.target in keep),
                      clusters=tuple(c for c in view.clusters if any(view.nodes[i].cluster == c[0] for i in part)),
                      same_rank=tuple(g for g in view.same_rank if set(g) <= keep))
        laid = layout_view(sub, engine="layered", widths=[widths[i] for i in part])
        nodes += [replace(n, x=n.x + left) for n in laid.nodes]
        edges += [replace(e, points=tuple((x + left, y) for x, y in e.points)) for e in laid.edges]
        left += laid.width + ISLAND_GAP
        height = max(height, laid.height)
    return GraphLayout(left - ISLAND_GAP, height, tuple(nodes), tuple(edges), "layered")


def _islands(view: ViewGraph) -> list[list[int]]:
    """Node indices: everything else first, then each cluster that no routed edge crosses."""
    cluster_of = {n.id: n.cluster for n in view.nodes}
    crossed = {c for e in view.edges if e.kind not in UNLAID_KINDS and e.source in cluster_of
               and e.target in cluster_of for c in (cluster_of[e.source], cluster_of[e.target])
               if cluster_of[e.source] != cluster_of[e.target]}
    alone = [c for c, _ in view.clusters if c not in crossed]
    parts = {c: [] for c in [None, *alone]}
    for k, n in enumerate(view.nodes):
        parts[n.cluster if n.cluster in alone else None].append(k)
    return [p for p in parts.values() if p]


def placed_widths(view: ViewGraph) -> list[int]:
    """Box widths in cells that hold each node's label and detail line at 10 pt (no cut, unlike the terminal's)."""
    out = []
    for n in view.nodes:
        chars = max(len(n.label), len(n.detail))
        round_shape = node_attrs(n).get("shape") in ROUND_SHAPES
        out.append(math.ceil(chars * CHAR_CELLS * (1.3 if round_shape else 1.0)) + (5 if round_shape else 3))
    return out


def _quote(text: str) -> str:
    body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return " + ".join(f'"{body[k:k + QUOTED_MAX]}"' for k in range(0, max(len(body), 1), QUOTED_MAX))


def _attrs(attrs: dict[str, str]) -> str:
    return " ".join(f"{k}={_quote(str(v))}" for k, v in attrs.items())


def placed_dot(view: ViewGraph, layout: GraphLayout) -> str:
    """DOT for `neato -n2`: every node, edge route and cluster at the position `layout` gave it."""
    top = layout.height

    def point(x: float, y: float) -> str:  # cells, y down -> points, y up
        return f"{x * CELL_W_PT:.1f},{(top - y) * CELL_H_PT:.1f}"

    ids = {n.id: f"v{k}" for k, n in enumerate(view.nodes)}
    boxes = layout.by_id
    lines = [f"digraph {_quote(view.view)} {{",
             f"graph [{_attrs(GRAPH_ATTRS)} splines=line outputorder=edgesfirst]",
             f"node [{_attrs({k: v for k, v in NODE_ATTRS.items() if k != 'height'})} fixedsize=shape]",
             f"edge [{_attrs(EDGE_ATTRS)}]"]

    def node_line(n) -> str:
        box = boxes[n.id]
        where = {"pos": point(box.x + box.width / 2, box.y + box.height / 2) + "!",
                 "width": f"{box.width * CELL_W_PT / 72:.3f}", "height": f"{box.height * CELL_H_PT / 72:.3f}"}
        attrs = node_attrs(n)
        if attrs.get("shape") == "circle":  # a circle as wide as "Σ d<tensor name>" would be as tall
            attrs["shape"] = "ellipse"
        return f"{ids[n.id]} [{_attrs({'label': node_label(n), 'id': n.id, **attrs, **where})}]"

    members: dict[str | None, list] = {}
    for n in view.nodes:
        members.setdefault(n.cluster, []).append(n)
    lines += [node_line(n) for n in members.pop(None, [])]
    for cluster, label in view.clusters:
        inside = members.get(cluster, [])
        if not inside:
            continue
        x0 = min(boxes[n.id].x for n in inside) - 1
        x1 = max(boxes[n.id].x + boxes[n.id].width for n in inside) + 1
        x1 = max(x1, x0 + math.ceil(len(label) * CHAR_CELLS * 1.1) + 2)  # its 11 pt label fits
        y0 = min(boxes[n.id].y for n in inside) - 2  # a row for the cluster's label
        y1 = max(boxes[n.id].y + boxes[n.id].height for n in inside) + 1
        bb = f"{x0 * CELL_W_PT:.1f},{(top - y1) * CELL_H_PT:.1f},{x1 * CELL_W_PT:.1f},{(top - y0) * CELL_H_PT:.1f}"
        lines.append(f"subgraph {_quote(cluster)} {{ graph [{_attrs({'label': label, **CLUSTER_ATTRS, 'bb': bb})}]")
        lines += [node_line(n) for n in inside]
        lines.append("}")
    routes = {(e.source, e.target): e.points for e in layout.edges}
    for e in view.edges:
        if e.source not in ids or e.target not in ids:
            continue
        attrs = edge_attrs(e)
        points = routes.get((e.source, e.target))
        if points:  # edges the layout left out (a Gradient node's inputs, "needs") are drawn straight
            attrs.update(_route(points, point, bool(e.label)))
        lines.append(f"{ids[e.source]} -> {ids[e.target]} [{_attrs(attrs)}]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _route(points, point, labelled: bool) -> dict[str, str]:
    """An orthogonal route as a Graphviz spline of straight pieces, from the source's bottom border to
    an arrowhead on the target's top border (layout.py keeps the row above a target vertical)."""
    (x0, y0), (xe, ye) = points[0], points[-1]
    via = [(x0 + 0.5, y0 + 1)] + [(x + 0.5, y + 0.5) for x, y in points[1:-1]] + [(xe + 0.5, ye - 0.5)]
    spline = [point(*via[0])]
    for a, b in zip(via, via[1:]):
        spline += [point(*a), point(*b), point(*b)]
    out = {"pos": f"e,{point(xe + 0.5, ye)} " + " ".join(spline)}
    if labelled:  # beside the middle of its longest piece
        a, b = max(zip(via, via[1:]), key=lambda ab: abs(ab[0][0] - ab[1][0]) + abs(ab[0][1] - ab[1][1]))
        out["lp"] = point((a[0] + b[0]) / 2 + 2, (a[1] + b[1]) / 2)
    return out

