"""Symbolic dimensions (`batch`, `seq`): one place to size every value the engine makes up.

A model exported with dynamic axes declares its inputs as `int64 [batch, seq]`. The values the
engine makes for tensors nobody fed (and the `zeros`/`ones`/`random` specs) need a size for such a
dim: the one set with `--dim seq=32` (`dims=` in Python, the dims dialog in the explorer), else the
size a fed tensor shows for it, else 1. A dim written as an expression over other names
(`past_sequence_length + sequence_length`, `engine.modelfile.dim_expr`) is sized from those names.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import FeedError
from ..modelfile.dim_expr import evaluate, is_expression, names_in, solve
from ..modelfile.index import GraphIndex

Dims = Mapping[str, int]


def symbolic_dims(graph: GraphIndex) -> dict[str, list[tuple[str, int]]]:
    """Each named dim of the graph inputs -> the (input, axis) pairs that carry it, in input order;
    an expression's names stand for it (its own size follows from theirs)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name in graph.inputs:
        info = graph.types.get(name)
        for axis, d in enumerate(info.shape if info is not None and info.shape is not None else ()):
            if isinstance(d, str) and d:
                for part in names_in(d):
                    out.setdefault(part, []).append((name, axis))
    return out


def parse_dims(text: str) -> dict[str, int]:
    """"seq=32,batch=2" -> {"seq": 32, "batch": 2}; FeedError names the part it cannot read."""
    dims: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, size = part.partition("=")
        try:
            value = int(size)
        except ValueError:
            value = -1
        if not eq or not name.strip() or value < (0 if is_past_dim(name.strip()) else 1):  # a past may be empty
            raise FeedError(f"bad dim {part!r}: write NAME=N with N a positive integer, e.g. seq=32,batch=2")
        dims[name.strip()] = value
    return dims


def check_dims(graph: GraphIndex, dims: Dims | None) -> dict[str, int]:
    """`dims` as a plain dict, refused in one line when a name is no symbolic dim of the graph."""
    dims = dict(dims or {})
    known = symbolic_dims(graph)
    declared = {part for info in graph.types.values() if info.shape for d in info.shape if isinstance(d, str)
                for part in (d, *names_in(d))}
    for name, size in dims.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < (0 if is_past_dim(name) else 1):
            raise FeedError(f"dim {name!r} must be a positive integer, not {size!r}")
        if name not in known and name not in declared:
            import difflib

            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            have = ", ".join(repr(d) for d in known) or "none: every input has a fixed shape"
            raise FeedError(f"{name!r} is not a symbolic dim of this model (its inputs' dims: {have}{hint})")
    return dims


def dims_from_feeds(graph: GraphIndex, feeds: Mapping[str, object], dims: Dims | None = None) -> dict[str, int]:
    """`dims`, plus the size each fed tensor shows for a named dim not set there: feeding
    input_ids of shape (2, 8) sizes the default attention_mask (2, 8) too. A size seen for an
    expression gives its one unknown name (a mask of 6 over `past + seq`, seq known: past=4)."""
    out = dict(dims or {})
    seen: list[tuple[str, int]] = []
    for name, value in feeds.items():
        info = graph.types.get(name)
        shape = getattr(value, "shape", None)
        if info is None or info.shape is None or shape is None or len(shape) != len(info.shape):
            continue
        for d, size in zip(info.shape, shape):
            if isinstance(d, str) and d and d not in out:
                out[d] = int(size)
                seen.append((d, int(size)))
    while True:  # each solved name may unlock another expression
        found = [hit for d, size in seen if is_expression(d) and (hit := solve(d, size, out))]
        if not found:
            return out
        out.update(found)


def dim_size(dim, dims: Dims | None, default: int = 1) -> int:
    """A declared dim's size: a number as declared, a name or expression from `dims`, else `default`."""
    if isinstance(dim, int) and dim > 0:
        return dim
    size = evaluate(dim, dims or {})
    return default if size is None or size < 0 else size


def is_past_dim(name: str) -> bool:
    """A dim counting cached positions: 0 is its size at the first step of generation."""
    return "past" in name.lower()


def sized(shape, dims: Dims | None) -> tuple[int, ...]:
    """A declared shape with named dims (and expressions over them) taken from `dims`, every other
    unknown dim as 1."""
    return tuple(dim_size(d, dims) for d in shape)


def describe_dims(graph: GraphIndex, names, dims: Dims | None) -> str | None:
    """"batch=1, seq=16" for the named dims of `names`' declared shapes (an expression's names,
    then the expression), or None when they have none."""
    seen: dict[str, int] = {}
    for n in names:
        info = graph.types.get(n)
        for d in (info.shape if info is not None and info.shape is not None else ()):
            if isinstance(d, str) and d:
                for part in (*names_in(d), d):
                    seen.setdefault(part, dim_size(part, dims))
    return ", ".join(f"{k}={v}" for k, v in seen.items()) or None
