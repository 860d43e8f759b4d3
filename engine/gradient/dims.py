"""Symbolic dimensions (`batch`, `seq`): one place to size every value the engine makes up.

A model exported with dynamic axes declares its inputs as `int64 [batch, seq]`. The values the
engine makes for tensors nobody fed (and the `zeros`/`ones`/`random` specs) need a size for such a
dim: the one set with `--dim seq=32` (`dims=` in Python, the dims dialog in the explorer), else the
size a fed tensor shows for it, else 1.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import FeedError
from ..modelfile.index import GraphIndex

Dims = Mapping[str, int]


def symbolic_dims(graph: GraphIndex) -> dict[str, list[tuple[str, int]]]:
    """Each named dim of the graph inputs -> the (input, axis) pairs that carry it, in input order."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name in graph.inputs:
        info = graph.types.get(name)
        for axis, d in enumerate(info.shape if info is not None and info.shape is not None else ()):
            if isinstance(d, str) and d:
                out.setdefault(d, []).append((name, axis))
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
            value = 0
        if not eq or not name.strip() or value < 1:
            raise FeedError(f"bad dim {part!r}: write NAME=N with N a positive integer, e.g. seq=32,batch=2")
        dims[name.strip()] = value
    return dims


def check_dims(graph: GraphIndex, dims: Dims | None) -> dict[str, int]:
    """`dims` as a plain dict, refused in one line when a name is no symbolic dim of the graph."""
    dims = dict(dims or {})
    known = symbolic_dims(graph)
    declared = {d for info in graph.types.values() if info.shape for d in info.shape if isinstance(d, str)}
    for name, size in dims.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
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
    input_ids of shape (2, 8) sizes the default attention_mask (2, 8) too."""
    out = dict(dims or {})
    for name, value in feeds.items():
        info = graph.types.get(name)
        shape = getattr(value, "shape", None)
        if info is None or info.shape is None or shape is None or len(shape) != len(info.shape):
            continue
        for d, size in zip(info.shape, shape):
            if isinstance(d, str) and d and d not in out:
                out[d] = int(size)
    return out


def sized(shape, dims: Dims | None) -> tuple[int, ...]:
    """A declared shape with named dims taken from `dims` and every other unknown dim as 1."""
    dims = dims or {}
    return tuple(d if isinstance(d, int) and d > 0 else int(dims.get(d, 1)) if isinstance(d, str) else 1
                 for d in shape)


def describe_dims(graph: GraphIndex, names, dims: Dims | None) -> str | None:
    """"batch=1, seq=16" for the named dims of `names`' declared shapes, or None when they have none."""
    dims = dims or {}
    seen: dict[str, int] = {}
    for n in names:
        info = graph.types.get(n)
        for d in (info.shape if info is not None and info.shape is not None else ()):
            if isinstance(d, str) and d:
                seen.setdefault(d, int(dims.get(d, 1)))
    return ", ".join(f"{k}={v}" for k, v in seen.items()) or None
