"""Which tensor of B stands for which tensor of A: by name first; what cannot be matched is listed, never
guessed. (Renamed tensors, a cast model's inserted Casts, fused contrib spans and QDQ pairs extend this.)
Torch-free: it reads the two graphs only."""
from __future__ import annotations

from dataclasses import dataclass

from ..modelfile.index import GraphIndex, node_inputs
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
    return graph.nodes[i].name if i is not None else ""


def match(a: GraphIndex, b: GraphIndex) -> Matching:
    """Tensors matched by name (same name on both sides); the rest of each side listed as unmatched."""
    a_names, b_names = _all_tensors(a), _all_tensors(b)
    b_set = set(b_names)
    tensors = {t: t for t in a_names if t in b_set}
    unmatched = [Unmatched("a", t, _producer_name(a, t), "no tensor of that name in B") for t in a_names
                 if t not in tensors]
    unmatched += [Unmatched("b", t, _producer_name(b, t), "no tensor of that name in A") for t in b_names
                  if t not in set(tensors.values())]
    return Matching(tensors, (), tuple(unmatched))
