"""Where graph layouts come from: the engine's `layout_graph`, and `layout_near` while it runs.

Graphviz places small graphs best; past a few hundred nodes the engine's own layered placement is
five times faster (0.2 s against 1 s on densenet, benchmarks/results/layout.json) and a third as
wide, which is what a terminal wants, so big models get it and the graph is drawn within budget.
Laying out a big graph still takes seconds (10,001 nodes), so the graph pane first shows the
neighbourhood of the cursor, laid out in milliseconds, and swaps in the whole layout when it comes.
"""
from __future__ import annotations

import engine

LAYERED_FROM_NODES = 400
LOCAL_FROM_NODES = 400  # from this many nodes the pane shows the cursor's neighbourhood first
LOCAL_BOXES = 120  # boxes in a neighbourhood: a few screens, laid out in about 15 ms


def layout_for(model, spec, view: str, placement: str = "auto"):
    """placement: "auto" (Graphviz for small graphs, layered for big ones), "dot" or "layered"."""
    if placement == "auto" and len(model.graph.nodes) >= LAYERED_FROM_NODES:
        placement = "layered"
    return engine.layout_graph(model, spec if view != "forward" else None, view=view, engine=placement)


def wants_local(model) -> bool:
    return len(model.graph.nodes) >= LOCAL_FROM_NODES


def local_near(model, spec, view: str, cursor: tuple):
    """The neighbourhood of the cursor (node index, tensor) in `view`, an engine.LocalLayout."""
    node_index, tensor = cursor
    return engine.layout_near(model, spec if view != "forward" else None, view, node_index=node_index,
                              tensor=tensor, limit=LOCAL_BOXES)
