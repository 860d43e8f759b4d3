"""Matching by graph position where names differ: from the tensors already matched (by name, graph inputs
and outputs by position), a node of B is matched to a node of A when it has the same op_type, the matched
inputs in the same slots (a converter's Casts and a quantizer's QDQ pairs looked through) and compatible
attributes; its outputs are then matched slot by slot, and so are constants read in the same slots
(initializers by shape and dtype, ties broken by their values; a constant one side folded is matched to
the other's computation of it). A node matched by its output matches its computed inputs (the walk back).
Repeated until nothing changes. Two equally good candidates match nothing (kept in `ambiguous`), unless
they compute one value (duplicates: either is right)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..modelfile.index import GraphIndex
from .match_graph import (
    attributes_score,
    constant_kind,
    constants_compatible,
    same_values,
    source,
    static_tensors,
    types_compatible,
    value_classes,
)


@dataclass
class WalkState:
    a: GraphIndex
    b: GraphIndex
    tensors: dict[str, str] = field(default_factory=dict)  # A -> B
    taken: dict[str, str] = field(default_factory=dict)  # B -> A
    nodes: dict[int, int] = field(default_factory=dict)  # A node index -> B node index
    b_used: set[int] = field(default_factory=set)
    ambiguous: dict[int, list[int]] = field(default_factory=dict)
    b_class: dict[str, str] = field(default_factory=dict)  # B tensor -> its class of equal values
    a_class: dict[str, str] = field(default_factory=dict)
    b_aliases: dict[str, list[str]] = field(default_factory=dict)  # a class -> its tensors
    a_static: frozenset[str] = frozenset()
    b_static: frozenset[str] = frozenset()
    b_on_constants: dict[str, list[int]] = field(default_factory=dict)  # op_type -> B nodes reading constants only

    def same_b(self, t: str, u: str) -> bool:
        return self.b_class.get(t, t) == self.b_class.get(u, u)

    def pair(self, ta: str, tb: str) -> bool:
        if not ta or not tb or ta in self.tensors or tb in self.taken:
            return False
        self.tensors[ta] = tb
        self.taken[tb] = ta
        return True


def _inputs(node) -> list[str]:
    """Inputs without trailing empty optional slots, so `Op(x, '')` and `Op(x)` compare equal."""
    ins = list(node.input)
    while ins and not ins[-1]:
        ins.pop()
    return ins


def seed_by_position(s: WalkState) -> None:
    """Graph inputs and outputs whose names differ, paired by position when both sides have the same count
    left over and their dtypes agree."""
    def declared(g: GraphIndex, t: str):
        info = g.types.get(t)
        return info.elem_type if info is not None else None

    for la, lb in ((s.a.inputs, s.b.inputs), (s.a.outputs, s.b.outputs)):
        left_a = [t for t in la if t not in s.tensors]
        left_b = [t for t in lb if t not in s.taken]
        if len(left_a) != len(left_b):
            continue
        for ta, tb in zip(left_a, left_b):
            da, db = declared(s.a, ta), declared(s.b, tb)
            if da is None or db is None or types_compatible(da, db):
                s.pair(ta, tb)


def _slot_score(s: WalkState, ta: str, tb: str) -> int | None:
    """How well B's input `tb` stands for A's input `ta`: 3 the very tensor matched, 2 the same value through
    carriers, 1 two unmatched constants of the same shape, None not at all. (3 and 2 weigh the same until
    the constants' values have spoken: a quantizer's QDQ pair must not lose Q's projection to K's.)"""
    if not ta or not tb:
        return 3 if ta == tb else None
    if s.tensors.get(ta) == tb:
        return 3
    matched = s.tensors.get(ta) or s.tensors.get(source(s.a, ta))
    if matched is not None:
        return 2 if s.same_b(matched, tb) else None
    if tb in s.taken:
        return None
    if constant_kind(s.a, ta) and constant_kind(s.b, tb) and constants_compatible(s.a, ta, s.b, tb):
        return 1
    if _folded(s, ta, tb):
        return 1
    return None


def _folded(s: WalkState, ta: str, tb: str) -> bool:
    """One side reads a constant where the other computes it from constants and shapes (an optimizer's
    constant folding)."""
    const_a, const_b = constant_kind(s.a, ta) is not None, constant_kind(s.b, tb) is not None
    return (const_b and not const_a and ta in s.a_static) or (const_a and not const_b and tb in s.b_static)


def _score(s: WalkState, ia: int, ib: int) -> tuple[int, int] | None:
    """(matched slots and attributes, slots matched without carriers), or None where B's node cannot be A's."""
    na, nb = s.a.nodes[ia], s.b.nodes[ib]
    if (na.op_type, na.domain or "", len(na.output)) != (nb.op_type, nb.domain or "", len(nb.output)):
        return None
    ins_a, ins_b = _inputs(na), _inputs(nb)
    if len(ins_a) != len(ins_b):
        return None
    total = attributes_score(na, nb)
    if total is None:
        return None
    exact = 0
    for ta, tb in zip(ins_a, ins_b):
        slot = _slot_score(s, ta, tb)
        if slot is None:
            return None
        total += min(slot, 2)
        exact += slot == 3
    return total, exact


def _candidates(s: WalkState, ia: int) -> set[int]:
    """B's unused nodes that read (possibly through carriers) what A's node reads from matched tensors."""
    out: set[int] = set()
    node = s.a.nodes[ia]
    for ta in _inputs(node):
        tb = s.tensors.get(ta) or s.tensors.get(source(s.a, ta))
        if tb is None:
            continue
        for alias in s.b_aliases.get(s.b_class.get(tb, tb), [tb]):
            out.update(j for j in s.b.consumers.get(alias, ()) if j not in s.b_used)
    if not out and node.input and all(constant_kind(s.a, t) for t in node.input if t):
        # computed from constants only (a ConstantOfShape of a Constant): their values decide, see _best
        out = {j for j in s.b_on_constants.get(node.op_type, ()) if j not in s.b_used}
    return out


def _value_ties(s: WalkState, ia: int, ib: int) -> int:
    """How many constant slots hold the same numbers: breaks ties between Q, K and V projections."""
    return sum(same_values(s.a, ta, s.b, tb) for ta, tb in zip(_inputs(s.a.nodes[ia]), _inputs(s.b.nodes[ib]))
               if ta not in s.tensors and constant_kind(s.a, ta))


def _best(s: WalkState, ia: int, cands: set[int]) -> list[int]:
    scored = {j: sc for j in cands if (sc := _score(s, ia, j)) is not None}
    if not scored:
        return []
    top = max(sc[0] for sc in scored.values())
    best = sorted(j for j, sc in scored.items() if sc[0] == top)
    if len(best) > 1:
        ranks = {j: (_value_ties(s, ia, j), scored[j][1]) for j in best}
        most = max(ranks.values())
        best = [j for j in best if ranks[j] == most]
    if len(best) > 1 and all(s.same_b(s.b.nodes[j].output[0], s.b.nodes[best[0]].output[0]) for j in best):
        best = best[:1]  # duplicates computing the same value: any of them is this node
    return best


def _by_name(s: WalkState, ia: int) -> int | None:
    """B's producer of A's first name-matched output (looking through carriers B added after it), when it has
    the same op_type: names are the primary key, so this holds even where the inputs differ."""
    na = s.a.nodes[ia]
    for slot, ta in enumerate(na.output):
        tb = s.tensors.get(ta)
        if tb is None:
            continue
        for t in (tb, source(s.b, tb)):
            j = s.b.producer.get(t)
            if j is not None and j not in s.b_used and list(s.b.nodes[j].output).index(t) == slot \
                    and (s.b.nodes[j].op_type, s.b.nodes[j].domain or "") == (na.op_type, na.domain or ""):
                return j
    return None


# Ops whose output says nothing of their data input's shape: B's merged Reshape reads a 2-D Gemm output
# where A's reads a 3-D Add, so the walk back does not pair what they read.
_RESHAPING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def bind(s: WalkState, ia: int, ib: int, by_output: bool = False) -> None:
    """Match two nodes, their outputs slot by slot and the constants they read in the same slots (a
    Constant node producing one is matched with its twin). Matched by their outputs (`by_output`), their
    computed inputs are matched slot by slot too: the walk back from matched outputs."""
    s.nodes[ia] = ib
    s.b_used.add(ib)
    s.ambiguous.pop(ia, None)
    na, nb = s.a.nodes[ia], s.b.nodes[ib]
    for ta, tb in zip(na.output, nb.output):
        if not s.pair(ta, tb) and ta and ta not in s.tensors and tb in s.taken and (
                s.a_class.get(s.taken[tb], s.taken[tb]) == s.a_class.get(ta, ta) or source(s.a, s.taken[tb]) == ta):
            s.tensors[ta] = tb  # a duplicate, or an Identity's input, of A's that B merged: one B tensor holds both
    if by_output and len(_inputs(na)) == len(_inputs(nb)) and attributes_score(na, nb) is not None:
        for slot, (ta, tb) in enumerate(zip(_inputs(na), _inputs(nb))):
            if not constant_kind(s.a, ta) and not constant_kind(s.b, tb) and ta not in s.a_static \
                    and not (slot == 0 and na.op_type in _RESHAPING):
                s.pair(ta, tb)
    for ta, tb in zip(_inputs(na), _inputs(nb)):
        if ta not in s.tensors and s.tensors.get(source(s.a, ta)) is not None \
                and s.same_b(s.tensors[source(s.a, ta)], tb):
            s.tensors[ta] = tb  # A's Cast, Identity or Div by 1 that B does without: B's tensor holds its value
            continue
        if ta in s.tensors or tb in s.taken:
            continue
        if _folded(s, ta, tb):
            s.pair(ta, tb)
            continue
        if not constant_kind(s.a, ta) or not constant_kind(s.b, tb):
            continue
        if constants_compatible(s.a, ta, s.b, tb) and s.pair(ta, tb):
            pa, pb = s.a.producer.get(ta), s.b.producer.get(tb)
            if pa is not None and pb is not None and pa not in s.nodes and pb not in s.b_used \
                    and s.a.nodes[pa].op_type == s.b.nodes[pb].op_type:
                s.nodes[pa] = pb
                s.b_used.add(pb)


def _same_as_matched(s: WalkState, ia: int) -> bool:
    """A node computing what another, matched, node of A computes (a duplicate B merged away): its outputs
    are the other's B tensors."""
    outs = [t for t in s.a.nodes[ia].output if t]
    twins = [s.a_class.get(t, t) for t in outs]
    if not outs or any(w == t or w not in s.tensors for t, w in zip(outs, twins)):
        return False
    if any(t in s.tensors for t in outs):
        return False
    twin_node = s.a.producer.get(twins[0])
    if twin_node in s.nodes:
        s.nodes[ia] = s.nodes[twin_node]
    for t, w in zip(outs, twins):
        s.tensors[t] = s.tensors[w]
    return True


def _prepare(s: WalkState) -> None:
    """What the walk looks up, once per pair of graphs."""
    s.b_class, s.a_class = value_classes(s.b), value_classes(s.a, through_carriers=False)
    s.a_static, s.b_static = static_tensors(s.a), static_tensors(s.b)
    for j, node in enumerate(s.b.nodes):
        if node.input and all(constant_kind(s.b, t) for t in node.input if t):
            s.b_on_constants.setdefault(node.op_type, []).append(j)
    for t in list(s.b.inputs) + list(s.b.initializers):
        s.b_aliases[t] = [t]
    for node in s.b.nodes:
        for t in node.output:
            if t:
                s.b_aliases.setdefault(s.b_class.get(t, t), []).append(t)


def walk(s: WalkState) -> None:
    """A's nodes in topological order, repeated to a fixpoint: by name where outputs share names, else by
    position from the matched inputs. Called again after new seeds (values), it goes on from them."""
    if not s.b_aliases:
        _prepare(s)
    changed = True
    while changed:
        changed = False
        for ia in range(len(s.a.nodes)):
            if ia in s.nodes:
                continue
            ib = _by_name(s, ia)
            if ib is not None:
                bind(s, ia, ib, by_output=True)
                changed = True
                continue
            if ib is None:
                best = _best(s, ia, _candidates(s, ia))
                if len(best) > 1:
                    s.ambiguous[ia] = best
                    continue
                ib = best[0] if best else None
            if ib is None and _same_as_matched(s, ia):
                changed = True
                continue
            if ib is not None:
                bind(s, ia, ib)
                changed = True
