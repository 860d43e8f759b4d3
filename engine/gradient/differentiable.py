"""Which edges of a graph carry a derivative: the static reading behind the selection extension
that lets an x be determined by zs (docs/semantics.md, "An x determined by zs").

An edge is a tensor read by a node. It carries no derivative when the tensor is not float
(integers, bools: indices, shapes, masks), when ONNX's schema marks that input of the op
NonDifferentiable (Shape, Size, Floor, Gather's indices, Where's condition...), or when none of
the node's outputs is float. An unknown type or op counts as differentiable: the answer may
refuse a selection it could allow, never allow one it should refuse.
"""
from __future__ import annotations

from functools import lru_cache

from ..modelfile.index import GraphIndex, node_inputs


@lru_cache(maxsize=None)
def _never(domain: str, op_type: str, opset: int) -> tuple[bool, ...]:
    """Per formal input of the op: whether ONNX's schema marks it NonDifferentiable (the last one
    stands for every variadic input after it); empty for an op the schema does not know."""
    try:
        import onnx
        from onnx.defs import OpSchema

        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # a custom or unknown op: assume every input carries a derivative
        return ()
    never = OpSchema.DifferentiationCategory.NonDifferentiable
    return tuple(p.differentiation_category == never for p in schema.inputs)


def _float(graph: GraphIndex, name: str) -> bool:
    info = graph.types.get(name)
    return info is None or not info.elem_type or info.is_float


def carries_derivative(graph: GraphIndex, node_index: int, k: int, tensor: str) -> bool:
    """Whether the node's k-th input (`tensor`) passes a derivative on to some output."""
    node = graph.nodes[node_index]
    if not _float(graph, tensor):
        return False
    never = _never(node.domain or "", node.op_type, graph.opset(node.domain))
    if never and k < len(node.input) and never[min(k, len(never) - 1)]:
        return False
    return any(_float(graph, t) for t in node.output if t)


def cut_ancestors(graph: GraphIndex, y: str, members: set[str]) -> set[str]:
    """Every tensor y reads in the graph cut at `members` (the members it reaches included)."""
    seen, stack = set(), [y]
    while stack:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t not in members and t in graph.producer:
            stack.extend(node_inputs(graph.nodes[graph.producer[t]]))
    return seen


def nondifferentiable_paths(graph: GraphIndex, z: str, y: str, members: set[str]) -> tuple[str, ...] | None:
    """How z reaches y by paths that avoid the other members: None when one of them carries a
    derivative all the way; else the edges where they lose it ("'input_ids' → Shape '/Shape'"),
    empty when z does not reach y around the members at all."""
    live = cut_ancestors(graph, y, members)
    if z not in live:
        return ()
    smooth, stack, breaks = {z}, [z], []
    while stack:
        t = stack.pop()
        for i in graph.consumers.get(t, []):
            node = graph.nodes[i]
            outs = [o for o in node.output if o and o in live and (o not in members or o == y)]
            if not outs:
                continue
            inputs = node_inputs(node)
            if not any(carries_derivative(graph, i, k, t) for k, name in enumerate(inputs) if name == t):
                text = f"{t!r} → {node.op_type} {graph.node_names[i]!r}"
                if text not in breaks:
                    breaks.append(text)
                continue
            for o in outs:
                if o == y:
                    return None
                if o not in smooth:
                    smooth.add(o)
                    stack.append(o)
    return tuple(breaks)
