"""The backward graph of a selection, its Graphviz drawing, and a layout for the terminal.

    build_backward_graph(model, spec) -> BackwardGraph
    gradient_with_stats(model, y, xs, zs, feeds, dy, ...) -> (GradientResult, GraphStats)
    to_dot(model, spec=None, view="forward", stats=None, collapse_chains=False) -> str
    render(dot_source, "out.svg")
    render_graph(model, "out.svg", spec, view)   (dot below 400 nodes, onnxgrad's own layout from there)
    layout_graph(model, spec=None, view="forward") -> GraphLayout   (cells, for the terminal)
    layout_near(model, spec, view, node_index=, tensor=) -> LocalLayout   (a neighbourhood, in ms)
    Canvas(layout).region(x, y, width, height) -> rows of tagged text Segments
"""
from .backward import BackwardEdge, BackwardGraph, BackwardNode, build_backward_graph
from .dot import GraphvizMissingError, render, to_dot
from .layout import GraphLayout, LayoutEdge, LayoutNode, layout_graph
from .local import LocalLayout, layout_near
from .stats import GraphStats, TensorStats, gradient_with_stats
from .svg import render_graph
from .terminal import Canvas, Segment, render_text
from .view import VIEWS

__all__ = [
    "BackwardGraph", "BackwardNode", "BackwardEdge", "build_backward_graph",
    "gradient_with_stats", "GraphStats", "TensorStats",
    "to_dot", "render", "render_graph", "GraphvizMissingError", "VIEWS",
    "layout_graph", "GraphLayout", "LayoutNode", "LayoutEdge", "layout_near", "LocalLayout",
    "Canvas", "Segment", "render_text",
]
