"""`Model.jvp` and `Model.hvp`: feeds, defaults and tangents in, numpy out, around the prepared forms.

The inputs come from the same `GradientCall` `Model.gradient` uses, so a feed, a default (seeded by
`seed`, sized by `dims`) and a refused interior feed mean the same in both modes. A tangent (a
direction v) is given per x: an array of x's shape, or "random" (standard normal, seeded by `seed`
and x's place in xs) or "ones"; one of those words alone stands for every x.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from ..dtypes import read_only, to_numpy
from ..errors import FeedError
from ..gradient.feeds import normal_blocks
from ..gradient.selection import GradientSpec

WORDS = ("random", "ones")


@dataclass(frozen=True)
class JVPResult:
    """What `Model.jvp` returns: y's value and J·v (shaped like y), numpy arrays."""

    spec: GradientSpec
    y: np.ndarray
    jvp: np.ndarray
    tangents: dict[str, np.ndarray]  # the v used, per x
    disconnected: frozenset[str]
    device: str = "cpu"
    dtype: str = "native"
    values: dict[str, np.ndarray] = field(default_factory=dict)  # xs ∪ zs as used, read-only


@dataclass(frozen=True)
class HVPResult:
    """What `Model.hvp` returns: y, dy/dx and H·v per x (each x's block of the Hessian times v)."""

    spec: GradientSpec
    y: np.ndarray
    grads: dict[str, np.ndarray]
    hvp: dict[str, np.ndarray]
    vs: dict[str, np.ndarray]  # the directions used, per x
    disconnected: frozenset[str]
    device: str = "cpu"
    dtype: str = "native"
    values: dict[str, np.ndarray] = field(default_factory=dict)


def direction(name: str, given, like: torch.Tensor, seed: int, index: int, what: str = "tangent") -> torch.Tensor:
    """The tangent (or direction) for x `name` whose value is `like`: from an array, "random" or "ones"."""
    if isinstance(given, str):
        if given == "ones":
            return torch.ones_like(like)
        if given == "random":  # drawn a block at a time into x's dtype: no float64 draw as big as x beside it
            out = torch.empty(tuple(like.shape), dtype=like.dtype)
            flat = out.view(-1)
            for start, block in normal_blocks((seed, index), flat.numel()):
                flat[start:start + block.size] = torch.from_numpy(block)
                del block  # before the next block is drawn
            return out.to(like.device)
        raise FeedError(f"{what} for {name!r} is {given!r}: give an array of its shape, 'random' or 'ones'")
    value = given if isinstance(given, torch.Tensor) else np.asarray(given)
    if isinstance(value, np.ndarray) and value.dtype.kind not in "fiu":
        raise FeedError(f"{what} for {name!r} holds {value.dtype} values, not numbers")
    if tuple(value.shape) != tuple(like.shape):
        raise FeedError(f"{what} for {name!r} has shape {tuple(value.shape)}, but {name!r} has shape "
                        f"{tuple(like.shape)}")
    t = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value, order="C"))
    return t.to(device=like.device, dtype=like.dtype)


def directions(spec: GradientSpec, given, xs: list[torch.Tensor], seed: int, what: str = "tangent"
               ) -> list[torch.Tensor]:
    """One direction per x from `given`: a word for all, a mapping x -> array or word, or (one x) its array."""
    if isinstance(given, str):
        return [direction(n, given, x, seed, i, what) for i, (n, x) in enumerate(zip(spec.xs, xs))]
    if not isinstance(given, Mapping):
        if len(spec.xs) != 1 or given is None:
            raise FeedError(f"{what}s: give a mapping from each x to an array, 'random' or 'ones'")
        given = {spec.xs[0]: given}
    unknown = [n for n in given if n not in spec.xs]
    if unknown:
        raise FeedError(f"{what} for {unknown[0]!r}, which is not in xs ({', '.join(spec.xs)})")
    missing = [n for n in spec.xs if n not in given]
    if missing:
        raise FeedError(f"no {what} for {', '.join(map(repr, missing))}: give an array of its shape, 'random' "
                        "or 'ones'")
    return [direction(n, given[n], x, seed, i, what) for i, (n, x) in enumerate(zip(spec.xs, xs))]


def _call(model, y, xs, zs, feeds, device, dtype, dims, past, seed):
    feeds = feeds if feeds is not None else {}
    if past is not None:
        from ..gradient.past_feeds import with_past

        dims = with_past(model.graph, dims, past)
    call = model.gradient_call(y, xs, zs, feeds, device=device, dtype=dtype)
    tensors, values = call.inputs(feeds, seed, dims)
    return call, tensors, {n: read_only(v) for n, v in values.items()}


def jvp(model, y: str, xs, tangents, zs=(), feeds=None, *, device="cpu", dtype=None, seed: int = 0,
        dims=None, past=None) -> JVPResult:
    call, tensors, values = _call(model, y, xs, zs, feeds, device, dtype, dims, past, seed)
    spec = call.spec
    prepared = model.prepare_jvp(y, xs, zs, device=call.dev, dtype=call.fdt, extra_inputs=call.prepared.extra_inputs)
    v = directions(spec, tangents, tensors[:len(spec.xs)], seed)
    out = prepared(*tensors, tangents=v)
    return JVPResult(spec=spec, y=to_numpy(out.y), jvp=to_numpy(out.jvp),
                     tangents={n: to_numpy(t) for n, t in zip(spec.xs, v)}, disconnected=out.disconnected,
                     device=call.device_label, dtype=call.dtype_label, values=values)


def hvp(model, y: str, xs, vs, zs=(), feeds=None, *, device="cpu", dtype=None, seed: int = 0,
        dims=None, past=None) -> HVPResult:
    call, tensors, values = _call(model, y, xs, zs, feeds, device, dtype, dims, past, seed)
    spec = call.spec
    prepared = model.prepare_hvp(y, xs, zs, device=call.dev, dtype=call.fdt, extra_inputs=call.prepared.extra_inputs)
    v = directions(spec, vs, tensors[:len(spec.xs)], seed, what="direction")
    out = prepared(*tensors, vs=v)
    return HVPResult(spec=spec, y=to_numpy(out.y), grads={n: to_numpy(g) for n, g in zip(spec.xs, out.grads)},
                     hvp={n: to_numpy(h) for n, h in zip(spec.xs, out.hvp)},
                     vs={n: to_numpy(t) for n, t in zip(spec.xs, v)}, disconnected=out.disconnected,
                     device=call.device_label, dtype=call.dtype_label, values=values)
