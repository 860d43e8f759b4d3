"""Validate a (y, xs, zs) selection against the rules of the ONNX Gradient operator.

The differentiated graph is the one identified by the names: it is cut at every member of
xs ∪ zs (whatever computes an intermediate member upstream is ignored), and `y` must be a
function of those members and the model's constants (initializers, Constant nodes) alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import SelectionError
from ..modelfile.index import GraphIndex, node_inputs


@dataclass(frozen=True)
class Determined:
    """A member of xs that zs determine, allowed by the documented extension (docs/semantics.md):
    `by` reach y around it only through the non-differentiable edges `through`."""

    x: str
    by: tuple[str, ...]
    through: tuple[str, ...]  # "'input_ids' → Shape '/Shape'": where each such path loses its derivative

    @property
    def note(self) -> str:
        shown = ", ".join(self.through[:3]) + (f" and {len(self.through) - 3} more" if len(self.through) > 3 else "")
        return (f"{self.x!r} is determined by {_join(self.by)}, allowed as an extension: "
                f"{_join(self.by)} reach{'es' if len(self.by) == 1 else ''} y around it only through "
                f"non-differentiable paths ({shown})")


@dataclass(frozen=True)
class GradientSpec:
    """A validated selection. `disconnected`: members of xs that `y` does not depend on;
    `determined`: members of xs allowed although zs determine them (see `Determined`)."""

    y: str
    xs: tuple[str, ...]
    zs: tuple[str, ...] = ()
    disconnected: frozenset[str] = frozenset()
    determined: tuple[Determined, ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        """The Gradient operator's input order: xs followed by zs."""
        return self.xs + self.zs


def names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Accept "A,B", ["A", "B"] or None."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def upstream(graph: GraphIndex, start: Iterable[str], stop: set[str]) -> tuple[set[str], set[str]]:
    """Walk producers up from `start`, halting at `stop`: (members of stop reached, unfed graph inputs reached)."""
    reached, free, seen = set(), set(), set()
    stack = [t for t in start if t]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in stop:
            reached.add(t)
        elif t in graph.producer:
            stack.extend(i for i in node_inputs(graph.nodes[graph.producer[t]]) if i)
        elif t not in graph.initializers:
            free.add(t)
    return reached, free


def needed_inputs(graph: GraphIndex, y: str, xs=(), zs=()) -> tuple[str, ...]:
    """The graph inputs y depends on in the graph cut at xs ∪ zs that are in neither: what zs
    still lacks (the explorer's one key and the CLI's `--zs inputs` add them)."""
    _, free = upstream(graph, [y], set(names(xs)) | set(names(zs)))
    return tuple(n for n in graph.inputs if n in free)


def unknown_name(graph: GraphIndex, name: str, role: str) -> SelectionError:
    return SelectionError(f"{role} {name!r} is not a tensor of this model{graph.did_you_mean(name)}")


def _join(items: Sequence[str]) -> str:
    items = [repr(i) for i in sorted(items)]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


ALL_INPUTS = "inputs"  # in zs: every graph input not in xs (unless the model has a tensor of that name)


def with_inputs_expanded(graph: GraphIndex, xs: tuple[str, ...], zs: tuple[str, ...]) -> tuple[str, ...]:
    """zs with `inputs` replaced, in place, by every graph input not already in xs or zs."""
    if ALL_INPUTS not in zs or graph.has_tensor(ALL_INPUTS):
        return zs
    at = zs.index(ALL_INPUTS)
    rest = tuple(n for n in graph.inputs if n not in xs and n not in zs)
    return zs[:at] + rest + tuple(n for n in zs[at + 1:] if n != ALL_INPUTS)


def validate(graph: GraphIndex, y: str, xs, zs=(), strict: bool = False) -> GradientSpec:
    """The rules of docs/semantics.md, in order; SelectionError at the first broken one. `strict`
    (Gradient nodes inside a model): no member of xs may be determined by zs, as the spec reads.
    Outside a model's own Gradient nodes, `inputs` in zs stands for every graph input not in xs."""
    xs, zs = names(xs), names(zs)
    if not strict:
        zs = with_inputs_expanded(graph, xs, zs)
    if not y:
        raise SelectionError("y is empty: name the tensor to differentiate")
    if not xs:
        raise SelectionError("xs is empty: name at least one tensor to differentiate with respect to")
    members = xs + zs
    dupes = sorted({n for n in members if members.count(n) > 1})
    if dupes:
        raise SelectionError(f"{_join(dupes)} listed more than once in xs ∪ zs")
    if not graph.has_tensor(y):
        raise unknown_name(graph, y, "y")
    for n in xs:
        if not graph.has_tensor(n):
            raise unknown_name(graph, n, "xs member")
    for n in zs:
        if not graph.has_tensor(n):
            raise unknown_name(graph, n, "zs member")
    for n in xs:
        info = graph.types.get(n)
        if info is not None and info.elem_type is not None and not info.is_float:
            from ..modelfile.elements import onnx_type_name

            raise SelectionError(
                f"{n!r} is {onnx_type_name(info.elem_type)}: only float tensors can be in xs (put it in zs)"
            )
    member_set = set(members)
    determined = []
    for n in members:
        if n not in graph.producer:
            continue
        others = member_set - {n}
        reached, free = upstream(graph, node_inputs(graph.nodes[graph.producer[n]]), others)
        if reached and not free:
            allowed = None if strict or n not in xs else around(graph, y, n, reached, set(zs), member_set)
            if allowed is None:
                role = "xs" if n in xs else "zs"
                raise SelectionError(
                    f"{n!r} cannot be in {role}: it is determined by {_join(reached)}, "
                    "so it is not an independent variable"
                )
            determined.append(allowed)
    reached, free = upstream(graph, [y], member_set)
    if free:
        raise SelectionError(
            f"y {y!r} is not determined by xs ∪ zs: it depends on {_join(free)}, which "
            + ("is in neither (add it to zs, or to xs to differentiate with respect to it)" if len(free) == 1 else
               "are in neither (add them to zs, or to xs to differentiate with respect to them)")
        )
    disconnected = frozenset(n for n in xs if n not in reached)
    return GradientSpec(y=y, xs=xs, zs=zs, disconnected=disconnected, determined=tuple(determined))


def node_selection(node) -> tuple[str, list[str], list[str]]:
    """(y, xs, zs) from the attributes of an ai.onnx.preview.training::Gradient node (None for y
    or xs when the node lacks the attribute)."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    xs = [v.decode() for v in attrs["xs"]] if "xs" in attrs else None
    zs = [v.decode() for v in attrs.get("zs", [])]
    return (attrs["y"].decode() if "y" in attrs else None), xs, zs


def check_gradient_node(graph: GraphIndex, i: int) -> None:
    """A Gradient node inside a model: its attributes, inputs and outputs agree, and its selection
    passes the spec's rules strictly; SelectionError (OnnxGradError without xs or y) naming it."""
    from ..errors import OnnxGradError

    node, name = graph.nodes[i], graph.node_names[i]
    y, xs, zs = node_selection(node)
    if xs is None or y is None:
        raise OnnxGradError(f"Gradient node {name!r} needs the attributes xs and y")
    if len(node.input) != len(xs) + len(zs):
        raise SelectionError(
            f"Gradient node {name!r} has {len(node.input)} inputs but xs and zs name {len(xs) + len(zs)}"
        )
    if len(node.output) > len(xs):
        raise SelectionError(f"Gradient node {name!r} has {len(node.output)} outputs but xs names {len(xs)}")
    missing = [m for m, t in zip(xs + zs, node.input) if not t]
    if missing:
        raise SelectionError(f"Gradient node {name!r} has no input for {missing[0]!r}: every member of xs and zs "
                             "needs one")
    try:
        validate(graph, y, xs, zs, strict=True)
    except SelectionError as exc:
        raise SelectionError(f"Gradient node {name!r}: {exc}") from None


def around(graph: GraphIndex, y: str, x: str, by: set[str], zs: set[str], members: set[str]) -> Determined | None:
    """The extension's test for an x that `by` determine: every one of `by` is in zs, at least one
    reaches y by a path avoiding the members (else listing it is needless and the spec's refusal
    stands), and no such path carries a derivative. The Determined, or None to refuse."""
    from .differentiable import nondifferentiable_paths

    if not by <= zs:
        return None
    through: list[str] = []
    reaches = False
    for z in sorted(by):
        found = nondifferentiable_paths(graph, z, y, members)
        if found is None:  # a path around x that carries a derivative
            return None
        reaches = reaches or bool(found)
        through += [t for t in found if t not in through]
    return Determined(x, tuple(sorted(by)), tuple(through)) if reaches else None
