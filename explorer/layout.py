"""Where graph layouts come from: the engine's `layout_graph`.

Graphviz places small graphs best; past a few hundred nodes the engine's own layered placement is
five times faster (0.2 s against 1 s on densenet, benchmarks/results/layout.json) and a third as
wide, which is what a terminal wants, so big models get it and the graph is drawn within budget.
"""
from __future__ import annotations

import engine

LAYERED_FROM_NODES = 400


def layout_for(model, spec, view: str, placement: str = "auto"):
    """placement: "auto" (Graphviz for small graphs, layered for big ones), "dot" or "layered"."""
    if placement == "auto" and len(model.graph.nodes) >= LAYERED_FROM_NODES:
        placement = "layered"
    return engine.layout_graph(model, spec if view != "forward" else None, view=view, engine=placement)
