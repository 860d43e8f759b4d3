"""Spans: a run of A's nodes that B computes with other nodes (onnxruntime's fused contrib ops, a
MatMulNBits standing for a MatMul with a float weight, an op swapped for another under the same output
name). Found from B's unmatched nodes whose outputs are matched: the span reaches back, on each side,
through tensors that have no counterpart, and stops at matched tensors, constants and graph inputs."""
from __future__ import annotations

from dataclasses import dataclass

from .match_graph import is_carrier, source
from .match_walk import WalkState


@dataclass(frozen=True)
class FoundSpan:
    a_nodes: tuple[int, ...]
    b_nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _a_of(s: WalkState, owners: dict[str, list[str]], tb: str) -> str | None:
    """A's tensor that B's `tb` holds: matched to it, or to the one tensor carrying the same value."""
    if tb in s.taken:
        return s.taken[tb]
    found = owners.get(source(s.b, tb), [])
    return found[0] if len(found) == 1 else None


def _closure(g, start: list[int], covered, stop_nodes: set[int]) -> tuple[list[int], list[str]]:
    """Nodes reached backwards from `start` through uncovered tensors; the tensors where it stopped."""
    nodes, boundary, stack = [], [], list(start)
    seen = set(start)
    while stack:
        i = stack.pop()
        nodes.append(i)
        for t in g.nodes[i].input:
            p = g.producer.get(t)
            if not t or t in boundary:
                continue
            if covered(t) or p is None or p in stop_nodes:
                boundary.append(t)
            elif p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(nodes), boundary


def _unbind_partial(s: WalkState) -> None:
    """A node pair matched by its output whose A node reads a computed tensor that has no counterpart (B
    merged two Reshapes into one, so A's first Reshape has no twin) cannot be compared alone: its
    gradient would flow into a tensor B does not hold. Unbound, B's node becomes a span reaching back
    through that tensor."""
    for ia, ib in list(s.nodes.items()):
        if any(t and t not in s.tensors and t not in s.a_static and s.a.producer.get(t) is not None
               for t in s.a.nodes[ia].input):
            del s.nodes[ia]
            if ib not in s.nodes.values():
                s.b_used.discard(ib)


def _a_producers(s: WalkState, owners, b_nodes) -> set[int]:
    """A's producers of every matched value B's span computes, on its way too (a SkipLayerNormalization's
    sum, read again downstream): the spans on both sides must hand over at the same tensors."""
    out = set()
    for j in b_nodes:
        for tb in s.b.nodes[j].output:
            ta = _a_of(s, owners, tb) if tb else None
            if ta is not None and s.a.producer.get(ta) is not None:
                out.add(s.a.producer[ta])
    return out


def find_spans(s: WalkState) -> tuple[list[FoundSpan], dict[int, str]]:
    """The spans, and why an unmatched B node that looked like one was not made one."""
    _unbind_partial(s)
    owners: dict[str, list[str]] = {}
    for ta, tb in s.tensors.items():
        owners.setdefault(source(s.b, tb), []).append(ta)
    spans: list[FoundSpan] = []
    refused: dict[int, str] = {}
    a_done = set(s.nodes)
    b_done = set(s.b_used)
    for ib in reversed(range(len(s.b.nodes))):
        if ib in b_done or is_carrier(s.b, ib) or all(t in s.b_static for t in s.b.nodes[ib].output):
            continue  # shape arithmetic is matched where it is read, not as a span
        outs = [(tb, ta) for tb in s.b.nodes[ib].output if tb and (ta := _a_of(s, owners, tb))]
        outs = [(tb, ta) for tb, ta in outs if s.a.producer.get(ta) is not None]
        if not outs:
            continue
        a_start = sorted({s.a.producer[ta] for _, ta in outs})
        if any(i in a_done for i in a_start):
            refused[ib] = "its outputs' producers in A are already matched to other nodes"
            continue
        b_nodes, _ = _closure(s.b, [ib], lambda t: _a_of(s, owners, t) is not None or t in s.b_static, b_done)
        a_start = sorted(set(a_start) | _a_producers(s, owners, b_nodes))
        if any(i in a_done for i in a_start):
            refused[ib] = "a value it computes on the way is computed in A by a node already matched to another"
            continue
        a_nodes, a_in = _closure(s.a, a_start, lambda t: t in s.tensors or t in s.a_static, a_done)
        a_set = set(a_nodes)
        a_in = [t for t in a_in if s.a.producer.get(t) not in a_set]  # a matched value the span computes itself
        outputs = [t for i in a_nodes for t in s.a.nodes[i].output if t in s.tensors]
        unmatched_in = [t for t in a_in if t not in s.tensors and t in s.a.inputs]
        if unmatched_in:
            refused[ib] = f"A's span reads graph input {unmatched_in[0]!r}, which has no counterpart in B"
            continue
        spans.append(FoundSpan(tuple(a_nodes), tuple(b_nodes), tuple(a_in), tuple(outputs)))
        a_done |= a_set
        b_done |= set(b_nodes)
    spans.reverse()
    return spans, refused
