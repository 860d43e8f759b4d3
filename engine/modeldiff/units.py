"""What is compared: A's nodes one by one, except where B computes a run of them otherwise (a matched
span, or B's own extra nodes such as a cast model's Casts): then the run is one unit, compared at its
boundary. Torch-free: it reads the two graphs and the matching."""
from __future__ import annotations

from dataclasses import dataclass

from ..modelfile.index import node_inputs
from .match_graph import constant_kind, static_tensors


@dataclass(frozen=True)
class Unit:
    a_nodes: tuple[int, ...]  # indices into A's graph.nodes, topological
    b_nodes: tuple[int, ...]  # indices into B's graph.nodes, topological (empty: B is onnxruntime)
    inputs: tuple[str, ...]  # A's tensors entering it
    outputs: tuple[str, ...]  # A's tensors leaving it that B also holds
    name: str
    op_type: str
    note: str = ""


def units(graph_a, graph_b, matching, order: list[int]) -> list[Unit]:
    """The units in A's topological `order` (the nodes A ran). A span is placed where its last node ran."""
    index_a = {n.name: i for i, n in enumerate(graph_a.nodes)}
    index_b = {n.name: i for i, n in enumerate(graph_b.nodes)} if graph_b is not None else {}
    span_of = {}
    for span in matching.spans:
        for name in span.a_nodes:
            span_of[index_a[name]] = span
    position, out = {i: k for k, i in enumerate(order)}, []
    a_produced = {t for n in graph_a.nodes for t in n.output if t}
    static_a = static_tensors(graph_a) if graph_b is not None else frozenset()
    stops = {matching.tensors[t] for t in a_produced if t in matching.tensors}
    for i in order:
        span = span_of.get(i)
        if span is None:
            node = graph_a.nodes[i]
            outputs = tuple(t for t in node.output if t and t in matching.tensors)
            if not outputs or (graph_b is not None and _folded(outputs, static_a, graph_b, matching.tensors)):
                continue
            b_nodes = _b_closure(graph_b, [matching.tensors[t] for t in outputs], stops) if graph_b else ()
            extra = len(b_nodes) - 1
            note = f"B computes it with {len(b_nodes)} nodes" if extra > 0 else ""
            if graph_b is not None and _handed_on(node, outputs, matching.tensors):
                b_nodes, note = (), "B does without it (its output is its input's value in B)"
            inputs = _live(graph_a, [t for t in node_inputs(node) if t], static_a, graph_b, matching.tensors)
            out.append(Unit((i,), b_nodes, inputs, outputs, node.name or node.output[0], node.op_type, note))
            continue
        members = [index_a[n] for n in span.a_nodes]
        if position[i] != max(position.get(m, -1) for m in members):
            continue
        b_nodes = tuple(sorted(index_b[n] for n in span.b_nodes if n in index_b))
        ops = "+".join(graph_b.nodes[j].op_type for j in b_nodes) if graph_b else ""
        inputs = _live(graph_a, span.inputs, static_a, graph_b, matching.tensors)
        out.append(Unit(tuple(sorted(members)), b_nodes, inputs, span.outputs, span.a_nodes[0],
                        ops or graph_a.nodes[members[0]].op_type, _span_note(ops, len(members))))
    return out


def _b_closure(graph_b, outputs: list[str], stops: set[str]) -> tuple[int, ...]:
    """B's nodes that compute `outputs` from tensors matched to A's computed values (or from B's
    inputs and initializers): the node itself, plus anything B inserted on the way (Casts, a QDQ pair)."""
    seen, todo = set(), list(outputs)
    while todo:
        t = todo.pop()
        j = graph_b.producer.get(t)
        if j is None or j in seen or (t in stops and t not in outputs):
            continue
        seen.add(j)
        todo.extend(x for x in node_inputs(graph_b.nodes[j]) if x)
    return tuple(sorted(seen))


def _folded(outputs, static_a, graph_b, tensors) -> bool:
    """Shape arithmetic of A that B holds as a constant (an optimizer folded it, and may have written
    another spelling of the same shape, such as Reshape's 0 for "keep this dim"): compared where it
    is read, not as a value of its own."""
    return all(t in static_a and constant_kind(graph_b, tensors[t]) is not None for t in outputs)


def _live(graph_a, inputs, static_a, graph_b, tensors) -> tuple[str, ...]:
    """The inputs compared: not a value A computes from shapes and constants where B holds a constant or
    nothing (ViT's 1/sqrt(head size), folded into a FusedMatMul's alpha): no gradient flows to it in B."""
    if graph_b is None:
        return tuple(inputs)
    return tuple(t for t in inputs if not (t in static_a and graph_a.producer.get(t) is not None and (
        t not in tensors or constant_kind(graph_b, tensors[t]) is not None)))


def _handed_on(node, outputs, tensors) -> bool:
    """A's Cast, Identity or Div by 1 that B dropped: each output stands for the very B tensor one of
    its inputs does, so B runs no node for it (its gradient passes through unchanged)."""
    held = {tensors[t] for t in node_inputs(node) if t in tensors}
    return all(tensors[t] in held for t in outputs)


def _span_note(b_ops: str, count: int) -> str:
    of_a = f"{count} node{'s' * (count != 1)} of A"
    return f"B's {b_ops} stands for {of_a}" if b_ops else f"span of {of_a}"
