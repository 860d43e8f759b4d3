"""Where graph layouts come from: the engine's `layout_graph` (Graphviz placement when installed)."""
from __future__ import annotations

import engine


def layout_for(model, spec, view: str):
    return engine.layout_graph(model, spec if view != "forward" else None, view=view)
