"""Graphviz DOT for the forward, backward and combined views, and writing .dot/.svg/.png files."""
from __future__ import annotations

import os
import shutil
import subprocess

import graphviz

from ..errors import OnnxGradError
from ..gradient.selection import GradientSpec
from .view import ViewEdge, ViewGraph, ViewNode, build_view


class GraphvizMissingError(OnnxGradError):
    """An .svg or .png was asked for and the Graphviz `dot` program is not installed."""


class GraphvizTimeoutError(OnnxGradError):
    """Graphviz ran past its time on a graph (svg.py then draws it from onnxgrad's own layout)."""


# Colours follow the role, so a reader learns them once for every view.
NODE_STYLE: dict[str, dict[str, str]] = {
    "x": {"shape": "ellipse", "style": "filled", "fillcolor": "#9ecae1"},
    "z": {"shape": "ellipse", "style": "filled", "fillcolor": "#fdd0a2"},
    "y": {"shape": "ellipse", "style": "filled", "fillcolor": "#a1d99b"},
    "input": {"shape": "ellipse"},
    "output": {"shape": "ellipse", "peripheries": "2"},
    "active": {"shape": "box", "style": "rounded,filled", "fillcolor": "#f0f0f0"},
    "inactive": {"shape": "box", "style": "rounded,dashed", "color": "#bdbdbd", "fontcolor": "#969696"},
    "gradient": {"shape": "box", "style": "filled,bold", "fillcolor": "#ffe699"},
    "backward": {"shape": "box", "style": "rounded,filled", "fillcolor": "#fcbba1"},
    "accumulate": {"shape": "circle", "style": "filled", "fillcolor": "#fff7bc", "margin": "0"},
    "seed": {"shape": "invhouse", "style": "filled", "fillcolor": "#a1d99b"},
    "dx": {"shape": "house", "style": "filled", "fillcolor": "#9ecae1"},
}
EDGE_STYLE: dict[str, dict[str, str]] = {
    "data": {},
    "output": {},
    "gradient_input": {"constraint": "false", "color": "#525252"},
    "cut": {"style": "dashed", "color": "#969696", "taillabel": "cut", "fontcolor": "#969696"},
    "grad": {"color": "#cb181d"},
    "partial": {"color": "#cb181d", "style": "dashed"},
    "needs": {"color": "#969696", "style": "dotted", "constraint": "false", "arrowhead": "empty"},
}


def view_to_dot(view: ViewGraph) -> str:
    """DOT text for an already built ViewGraph; node ids are v0, v1, ... in the view's order."""
    dot = graphviz.Digraph(
        name=view.view,
        graph_attr={"rankdir": "TB", **GRAPH_ATTRS, "nodesep": "0.3", "ranksep": "0.35", "newrank": "true"},
        node_attr=NODE_ATTRS,
        edge_attr=EDGE_ATTRS,
    )
    ids = {n.id: f"v{k}" for k, n in enumerate(view.nodes)}
    by_id = {n.id: n for n in view.nodes}
    members: dict[str | None, list] = {}
    for n in view.nodes:
        members.setdefault(n.cluster, []).append(n)

    def add_node(target, n) -> None:
        target.node(ids[n.id], node_label(n), id=n.id, **node_attrs(n))

    for n in members.get(None, []):
        add_node(dot, n)
    for cluster, label in view.clusters:
        with dot.subgraph(name=cluster) as sub:
            sub.attr(label=label, **CLUSTER_ATTRS)
            for n in members.get(cluster, []):
                add_node(sub, n)
            for group in view.same_rank:
                if all(n in ids and by_id[n].cluster == cluster for n in group):
                    sub.body.append("\t{rank=same; " + " ".join(ids[n] for n in group) + "}\n")
    for e in view.edges:
        if e.source not in ids or e.target not in ids:
            continue
        dot.edge(ids[e.source], ids[e.target], **edge_attrs(e))
    return dot.source


GRAPH_ATTRS = {"fontname": "Helvetica", "fontsize": "11"}
NODE_ATTRS = {"fontname": "Helvetica", "fontsize": "10", "height": "0.3"}
EDGE_ATTRS = {"fontname": "Helvetica", "fontsize": "8", "arrowsize": "0.6"}
CLUSTER_ATTRS = {"style": "rounded,dashed", "color": "#737373", "fontsize": "10"}


def node_label(n: ViewNode) -> str:
    return n.label if not n.detail else f"{n.label}\n{n.detail}"


def node_attrs(n: ViewNode) -> dict[str, str]:
    """A node's style (label and id aside): the same in dot's drawing and in a placed one (svg.py)."""
    attrs = dict(NODE_STYLE.get(n.role, {}))
    if n.chain:
        attrs["peripheries"] = "2"
    return attrs


def edge_attrs(e: ViewEdge) -> dict[str, str]:
    attrs = dict(EDGE_STYLE.get(e.kind, {}))
    if e.label:
        attrs["label"] = e.label
    if e.alert:
        attrs.update(color="#e31a1c", penwidth="2")
    return attrs


def to_dot(model, spec: GradientSpec | None = None, view: str = "forward", stats=None,
           collapse_chains: bool = False) -> str:
    """DOT source of a model's forward, backward or combined view (see engine.graphs.view)."""
    return view_to_dot(build_view(model, spec, view, stats, collapse_chains=collapse_chains))


def dot_program() -> str | None:
    return shutil.which("dot")


def checked_output(path: str | os.PathLike) -> tuple[str, str]:
    """(path, format) of a drawing to write; OnnxGradError for a format or a folder that will not do."""
    path = os.fspath(path)
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    if fmt not in ("dot", "gv", "svg", "png"):
        raise OnnxGradError(f"cannot write {path}: the file name must end in .dot, .svg or .png")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OnnxGradError(f"cannot write {path}: folder {folder} does not exist")
    return path, fmt


def render(dot_source: str, path: str | os.PathLike, *, timeout: float = 300) -> str:
    """Write DOT source as .dot, or through Graphviz's `dot` as .svg/.png, at `path`."""
    path, fmt = checked_output(path)
    if fmt in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(dot_source)
        return path
    program = dot_program()
    if program is None:
        raise GraphvizMissingError(
            f"writing .{fmt} needs the Graphviz 'dot' program, which is not installed "
            "(install graphviz, or write a .dot file instead)"
        )
    try:
        done = subprocess.run([program, f"-T{fmt}", "-o", path], input=dot_source.encode("utf-8"),
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GraphvizTimeoutError(f"Graphviz dot took longer than {timeout:.0f} s on this graph; "
                                   "try --collapse-chains or write a .dot file") from None
    if done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise OnnxGradError(f"Graphviz dot failed: {first}")
    return path
