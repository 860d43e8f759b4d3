"""The diff's per-node values as Google Model Explorer node data: the JSON its node-data overlay loads, so
the HTML report's colours show in that viewer too.

The format (model_explorer/node_data_builder.py, `ModelNodeData`): graph id -> {"results": {node id:
{"value", "bgColor"}}, "thresholds": [...], "name"}. With model-explorer-onnx the graph id is the ONNX
graph's name ("<main>" when it has none) and a node id is the ONNX node's name, made unique and given
to unnamed nodes as onnx_ir's NameFixPass does (explorer_node_ids). The value is local error over
tolerance: above 1 diverges.
"""
from __future__ import annotations

import math
from collections import Counter

from .html import DIVERGING, divergence_colour, ratio
from .report import FORWARD, GRADIENT, DiffReport, NodeDiff

UNNAMED_GRAPH = "<main>"
BEYOND = 1e30  # JSON has no Inf: an infinite (or NaN) ratio is written as this


def model_explorer_node_data(report: DiffReport, where: str = FORWARD, graph=None) -> dict:
    """Node data for A's graph: one result per compared node of `where` ("forward" or "gradient").

    graph: A's GraphIndex, which gives the graph id and the ids model-explorer-onnx gives unnamed and
    duplicate-named nodes; without it the graph id is "<main>" and node names are used as they are."""
    if where not in (FORWARD, GRADIENT):
        raise ValueError(f"where must be {FORWARD!r} or {GRADIENT!r}, not {where!r}")
    ids = explorer_node_ids(graph) if graph is not None else {}
    results = {}
    for row in report.nodes:
        if row.where != where:
            continue
        r = ratio(row)
        value = BEYOND if not math.isfinite(r) else float(r)
        results[ids.get(row.node, row.node)] = {"value": value, "bgColor": divergence_colour(row)}
    graph_id = (graph.model.graph.name or UNNAMED_GRAPH) if graph is not None else UNNAMED_GRAPH
    return {graph_id: {
        "name": f"onnxgrad diff: {where} local error / tolerance",
        "results": results,
        # Per-result bgColor already colours each node; the thresholds say the same for the legend.
        "thresholds": [{"value": 1, "bgColor": divergence_colour(_at_ratio(1.0))},
                       {"value": BEYOND, "bgColor": DIVERGING}],
    }}


def explorer_node_ids(graph) -> dict[str, str]:
    """The engine's display name of each node -> the id model-explorer-onnx (0.4) gives it: onnx_ir's
    NameFixPass walks the nodes in file order, each node's subgraphs right after it, one name scope per
    graph and one counter for all, naming an unnamed node "node", "node_1", ... and renaming a repeated
    name "name_1", ..."""
    counter: Counter[str] = Counter()
    given: dict[int, str] = {}

    def walk(nodes) -> None:
        used: set[str] = set()
        for node in nodes:
            preferred = name = node.name or "node"
            while name in used:
                counter[preferred] += 1
                name = f"{preferred}_{counter[preferred]}"
            used.add(name)
            given[id(node)] = name
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub.node)

    walk(graph.model.graph.node)
    return {name: given.get(id(node), name) for name, node in zip(graph.node_names, graph.nodes)}


def _at_ratio(r: float) -> NodeDiff:
    return NodeDiff("", "", FORWARD, 0, local_error=r, tolerance=1.0)
