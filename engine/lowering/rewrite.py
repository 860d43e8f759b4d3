"""Replace nodes of a model's graph by the ai.onnx nodes an expansion writes, before lowering: the
contrib ops (engine/lowering/contrib.py) and the standard ops onnxruntime has no kernel for
(engine/lowering/portable.py). An expansion writes the node's own output names, so selections naming
them still resolve; the nodes it adds are offered to the expansions in turn.
"""
from __future__ import annotations

from typing import Callable

import onnx
from onnx import ModelProto, NodeProto

from ..modelfile.reader import checkable, crashes_inference
from .context import Ctx, TypeInfo, collect_types, known_values

Expansion = Callable[[Ctx, NodeProto], None]


def opset_of(proto: ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


def expand_nodes(proto: ModelProto, weights, expansion_for: Callable[[Ctx, NodeProto], Expansion | None],
                 prefix: str, types: dict[str, TypeInfo] | None = None, constants=None) -> bool:
    """Replace (in place) each node of proto's graph for which `expansion_for(ctx, node)` names an
    expansion by the nodes that expansion adds; whether any was. `types` and `constants`: the graph's
    tensor types and known values when the caller has them (else shape inference finds the types).
    Initializers whose bytes are in `weights` (engine/modelfile/weights.py) are read from there when an
    expansion needs their values."""
    graph = proto.graph
    if types is None:
        try:
            if crashes_inference(graph):
                raise ValueError("onnx's shape inference would crash the process")
            typed = onnx.shape_inference.infer_shapes(checkable(proto, weights.detached() if weights is not None else ()))
        except Exception:  # noqa: BLE001 - expansions that need a type say so in one line
            typed = proto
        types = collect_types(typed)
    used = {t for n in graph.node for t in list(n.output) + list(n.input) + [n.name]}
    constants = known_values(proto, weights) if constants is None else constants
    ctx = Ctx(dict(types), constants, used | {i.name for i in graph.initializer}, prefix,
              opset_of(proto))
    nodes: list[NodeProto] = []

    def visit(node: NodeProto) -> None:
        ctx.node = node
        fn = expansion_for(ctx, node)
        if fn is None:
            nodes.append(node)
            return
        start = len(ctx.nodes)
        fn(ctx, node)
        added = ctx.nodes[start:]
        ctx.infer(added, [t for t in node.input if t])
        for n in added:
            visit(n)

    for node in list(graph.node):
        visit(node)
    if not ctx.nodes:
        return False
    del graph.node[:]
    graph.node.extend(nodes)
    return True


def drop_unused_domains(proto: ModelProto, domains) -> None:
    """In place: the opset imports of `domains` that no node of the graph uses any more."""
    present = {n.domain for n in proto.graph.node}
    kept = [o for o in proto.opset_import if o.domain not in domains or o.domain in present]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)
