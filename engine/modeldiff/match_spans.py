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


def _grow(s: WalkState, owners, ib: int, a_start: set[int], fixed_a: set[int], fixed_b: set[int],
          a_span: dict[int, int], b_span: dict[int, int], spans: list):
    """The span B's node `ib` starts: (A's nodes, B's nodes, A's inputs, the earlier spans it takes in), or
    why there is none. Where either side reaches an unmatched value that an earlier span computes (B's
    Split feeding three Transposes, each found on its own), that span is taken in: both sides must hand
    over at matched tensors only."""
    def covered_b(t):
        return _a_of(s, owners, t) is not None or t in s.b_static

    def covered_a(t):
        return t in s.tensors or t in s.a_static

    absorbed = {a_span[i] for i in a_start if i in a_span}
    while True:
        extra_a = {i for k in absorbed for i in spans[k].a_nodes}
        extra_b = {j for k in absorbed for j in spans[k].b_nodes}
        b_nodes, b_in = _closure(s.b, [ib, *sorted(extra_b)], covered_b, fixed_b | (set(b_span) - extra_b))
        starts = set(a_start) | _a_producers(s, owners, b_nodes) | extra_a
        if starts & fixed_a:
            return "a value it computes on the way is computed in A by a node already matched to another"
        a_nodes, a_in = _closure(s.a, sorted(starts), covered_a, fixed_a | (set(a_span) - extra_a))
        touched = {b_span[s.b.producer[t]] for t in b_in if s.b.producer.get(t) in b_span and not covered_b(t)}
        touched |= {a_span[s.a.producer[t]] for t in a_in if s.a.producer.get(t) in a_span and not covered_a(t)}
        touched |= {a_span[i] for i in starts if i in a_span}
        if touched <= absorbed:
            return a_nodes, b_nodes, a_in, absorbed
        absorbed |= touched


def find_spans(s: WalkState) -> tuple[list[FoundSpan], dict[int, str]]:
    """The spans, and why an unmatched B node that looked like one was not made one."""
    _unbind_partial(s)
    owners: dict[str, list[str]] = {}
    for ta, tb in s.tensors.items():
        owners.setdefault(source(s.b, tb), []).append(ta)
    spans: list[FoundSpan | None] = []
    refused: dict[int, str] = {}
    fixed_a, fixed_b = set(s.nodes), set(s.b_used)  # matched one for one
    a_span: dict[int, int] = {}  # node -> its span's index in `spans`
    b_span: dict[int, int] = {}
    for ib in reversed(range(len(s.b.nodes))):
        if ib in fixed_b or ib in b_span or is_carrier(s.b, ib) or all(t in s.b_static for t in s.b.nodes[ib].output):
            continue  # shape arithmetic is matched where it is read, not as a span
        outs = [ta for tb in s.b.nodes[ib].output if tb and (ta := _a_of(s, owners, tb))]
        a_start = {s.a.producer[ta] for ta in outs if s.a.producer.get(ta) is not None}
        if not a_start:
            continue
        if a_start & fixed_a:
            refused[ib] = "its outputs' producers in A are already matched to other nodes"
            continue
        grown = _grow(s, owners, ib, a_start, fixed_a, fixed_b, a_span, b_span, spans)
        if isinstance(grown, str):
            refused[ib] = grown
            continue
        a_nodes, b_nodes, a_in, absorbed = grown
        a_set = set(a_nodes)
        a_in = [t for t in a_in if s.a.producer.get(t) not in a_set]  # a matched value the span computes itself
        unmatched_in = [t for t in a_in if t not in s.tensors and t in s.a.inputs]
        if unmatched_in:
            refused[ib] = f"A's span reads graph input {unmatched_in[0]!r}, which has no counterpart in B"
            continue
        outputs = [t for i in a_nodes for t in s.a.nodes[i].output if t in s.tensors]
        for k in absorbed:
            spans[k] = None
        a_span.update((i, len(spans)) for i in a_nodes)
        b_span.update((j, len(spans)) for j in b_nodes)
        spans.append(FoundSpan(tuple(a_nodes), tuple(b_nodes), tuple(a_in), tuple(outputs)))
    return [f for f in reversed(spans) if f is not None], refused
