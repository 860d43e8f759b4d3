"""Which tensor of B stands for which tensor of A. Names first (a same-named tensor stays matched even
where its producer differs: the numeric diff shows the difference); then graph position (engine/modeldiff/
match_walk.py), looking through the Casts a float16 converter inserts and a quantizer's QDQ pairs; then
spans of A's nodes that B computes with other nodes, compared at their boundary (match_spans.py).
What cannot be matched is listed with the reason, never guessed. Torch-free: it reads the two graphs only."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..modelfile.index import GraphIndex, node_inputs
from .match_graph import constant_kind, is_carrier, source
from .match_spans import find_spans
from .match_values import match_by_value
from .match_walk import WalkState, seed_by_position, walk
from .report import Unmatched


@dataclass(frozen=True)
class Span:
    """A run of A's nodes that B computes with other nodes (a fused contrib op, a dequantize-then-op pair):
    compared at the span's boundary, its local error is the whole span's."""

    a_nodes: tuple[str, ...]
    b_nodes: tuple[str, ...]
    inputs: tuple[str, ...]  # A's tensors entering the span
    outputs: tuple[str, ...]  # A's tensors leaving it (each matched in `tensors`)


@dataclass(frozen=True)
class Matching:
    tensors: dict[str, str]  # A's tensor -> B's tensor holding the same value
    spans: tuple[Span, ...] = ()
    unmatched: tuple[Unmatched, ...] = ()
    # A's node -> B's node computing it one for one (same op_type; B's Casts around it not named)
    nodes: dict[str, str] = field(default_factory=dict)

    def b_of(self, a_tensor: str) -> str | None:
        return self.tensors.get(a_tensor)


def _all_tensors(graph: GraphIndex) -> list[str]:
    names = list(graph.inputs) + list(graph.initializers)
    for node in graph.nodes:
        names.extend(t for t in node_inputs(node) if t)
        names.extend(t for t in node.output if t)
    return list(dict.fromkeys(names))


def _producer_name(graph: GraphIndex, tensor: str) -> str:
    i = graph.producer.get(tensor)
    return graph.node_names[i] if i is not None else ""


def match(a: GraphIndex, b: GraphIndex, *, values: tuple[Mapping, Mapping] | None = None,
          rtol: float = 1e-2) -> Matching:
    """Every tensor of A matched to the tensor of B holding its value, where one can be named for sure.

    values: (A's values, B's values) by tensor name, from running both on the same feeds: what neither
    names nor position matched is then matched to the one B tensor of the same shape holding the same
    numbers within `rtol` of their scale (the default leaves room for float16)."""
    a_names, b_names = _all_tensors(a), _all_tensors(b)
    s = WalkState(a, b)
    b_set = set(b_names)
    for t in a_names:
        if t in b_set:
            s.pair(t, t)
    seed_by_position(s)
    walk(s)
    while values is not None and match_by_value(s, values[0], values[1], rtol):
        walk(s)
    _inside_dropped_chains(s)
    found, refused = find_spans(s)
    spans = tuple(Span(tuple(a.node_names[i] for i in f.a_nodes), tuple(b.node_names[j] for j in f.b_nodes),
                       f.inputs, f.outputs) for f in found)
    nodes = {a.node_names[i]: b.node_names[j] for i, j in sorted(s.nodes.items())}
    unmatched = _unmatched_a(s, a_names, found) + _unmatched_b(s, b_names, found, refused)
    return Matching(dict(s.tensors), spans, tuple(unmatched), nodes)


def _inside_dropped_chains(s: WalkState) -> None:
    """A chain of A's carriers that B dropped whole (a Softmax's two float Casts): the walk matched the
    chain's end to B's tensor holding its source's value; the links in between hold that value too."""
    a = s.a
    for i, node in enumerate(a.nodes):
        out = node.output[0] if node.output else ""
        if not out or out in s.tensors or not is_carrier(a, i) or source(a, out) not in s.tensors:
            continue
        held, todo = s.tensors[source(a, out)], list(a.consumers.get(out, []))
        while todo:
            k = todo.pop()
            if is_carrier(a, k):
                if s.tensors.get(a.nodes[k].output[0]) == held:
                    s.tensors[out] = held
                    break
                todo.extend(a.consumers.get(a.nodes[k].output[0], []))


def _unmatched_a(s: WalkState, names: list[str], found) -> list[Unmatched]:
    a, b = s.a, s.b
    in_span = {i: f for f in found for i in f.a_nodes}
    out = []
    for t in names:
        if t in s.tensors:
            continue
        i = a.producer.get(t)
        users = a.consumers.get(t, [])
        if i is None and users and all(k in in_span for k in users):
            fused = ", ".join(b.node_names[j] for j in in_span[users[0]].b_nodes)
            why = f"a constant read only inside a span that B computes as {fused}"
        elif i is None and users and all(is_carrier(a, k) and a.nodes[k].output[0] in s.tensors for k in users):
            why = f"read only by {a.node_names[users[0]]!r}, which hands its input on and which B does without"
        elif i is None and users and all(k not in s.nodes and a.nodes[k].output[0] in s.a_static for k in users):
            why = "read only by nodes computed from constants and shapes, which B folded into constants"
        elif i is None:
            what = "graph input" if t in a.inputs else "initializer" if t in a.initializers else "tensor"
            why = f"{what}: B has none of that name, and none of the same shape and dtype in the same place"
        elif i in in_span:
            fused = ", ".join(b.node_names[j] for j in in_span[i].b_nodes)
            why = f"inside a span that B computes as {fused}: compared at the span's boundary"
        elif i in s.ambiguous:
            tied = " and ".join(repr(b.node_names[j]) for j in s.ambiguous[i][:3])
            why = f"ambiguous: B's {tied} stand for node {a.node_names[i]!r} equally well"
        elif t in s.a_static and i not in s.nodes:
            why = "computed from constants and shapes only, and B computes it nowhere (folded into a constant)"
        elif i in s.nodes:
            why = f"its node's counterpart {b.node_names[s.nodes[i]]!r} has that output matched elsewhere"
        else:
            node = a.nodes[i]
            why = f"no {node.op_type} node of B reads the counterparts of {a.node_names[i]!r}'s inputs"
        out.append(Unmatched("a", t, a.node_names[i] if i is not None else "", why))
    return out


def _unmatched_b(s: WalkState, names: list[str], found, refused: dict[int, str]) -> list[Unmatched]:
    b = s.b
    carried = {source(b, tb) for tb in s.taken}
    in_span = _with_static_feeders(s, {j for f in found for j in f.b_nodes})
    out = []
    for t in names:
        j = b.producer.get(t)
        if t in s.taken or source(b, t) in carried:
            continue  # matched, or a Cast / QDQ copy of a matched value
        if j is not None and j in in_span:
            continue  # inside a span: compared at its boundary
        users = b.consumers.get(t, [])
        if j is None and users and all(k in in_span for k in users):
            continue  # a constant of the fused computation (a Gemm's reshape target)
        if _quantizer_part(b, t, carried):
            continue
        if j is not None and j in refused:
            why = refused[j]
        elif j is not None and t in s.b_static:
            why = "computed from constants and shapes only, and A computes it nowhere"
        elif j is not None and is_carrier(b, j):
            why = "a Cast or QDQ copy of a tensor that has no counterpart in A"
        elif j is None:
            what = "initializer" if constant_kind(b, t) else "graph input"
            why = f"{what}: A has none of that name, and none of the same shape and dtype in the same place"
        else:
            why = f"{b.nodes[j].op_type} node {b.node_names[j]!r} stands for no node of A"
        out.append(Unmatched("b", t, b.node_names[j] if j is not None else "", why))
    return out


def _with_static_feeders(s: WalkState, in_span: set[int]) -> set[int]:
    """The spans' B nodes, plus B's nodes that compute constants only the spans read (a fused Attention's
    mask index, reduced from a folded constant): part of the fused computation, not values of their own."""
    b, out = s.b, set(in_span)
    for j in reversed(range(len(b.nodes))):
        outs = [t for t in b.nodes[j].output if t]
        users = [k for t in outs for k in b.consumers.get(t, [])]
        if j not in out and outs and users and all(t in s.b_static and t not in s.taken for t in outs) \
                and all(k in out for k in users):
            out.add(j)
    return out


def _quantizer_part(b: GraphIndex, t: str, carried: set[str]) -> bool:
    """A scale, zero point or quantized value that only a looked-through QDQ pair, or the dequantization of a
    matched weight, reads: part of how B carries a value, not a value of its own."""
    users = b.consumers.get(t, [])
    if not users or (b.producer.get(t) is not None and b.nodes[b.producer[t]].op_type != "QuantizeLinear"):
        return False
    def carries(j: int) -> bool:
        node = b.nodes[j]
        if node.op_type == "QuantizeLinear":
            return all(is_carrier(b, k) for k in b.consumers.get(node.output[0], []))
        return is_carrier(b, j) or (node.op_type == "DequantizeLinear" and node.output[0] in carried)

    return all(carries(j) for j in users)
