"""The frozen jobs the session hands to worker threads: everything one run needs, copied when asked."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import engine
from engine.dtypes import read_only, to_numpy

# Bytes of intermediates (declared shapes, float64 counted) up to which one pass keeps them all:
# the 10,001-node chain takes 2.4 MiB; light_densenet121 (674 MiB) is asked one tensor at a time.
VALUES_BUDGET = 256 << 20


@dataclass(frozen=True)
class CheckOptions:
    mode: str = "auto"  # the engine picks full or fast by the size of xs
    rtol: float | None = None
    atol: float | None = None
    order: int = 1
    per_node: bool = False
    seed: int = 0


@dataclass(frozen=True)
class GradientJob:
    """Everything one gradient run needs, copied from the session at the time it was asked for."""

    model: engine.Model
    spec: engine.GradientSpec
    feeds: dict[str, np.ndarray]
    device: str
    dtype: str
    generation: int
    seed: int = 0  # for a default the engine draws (an intermediate member it cannot compute)
    dims: dict[str, int] = field(default_factory=dict)

    def run(self):
        """(GradientResult, GraphStats): the stats are what flowed along each edge of the backward graph."""
        spec = self.spec
        result, stats = engine.gradient_with_stats(self.model, spec.y, spec.xs, spec.zs, self.feeds, None,
                                                   device=self.device, dtype=self.dtype, seed=self.seed,
                                                   dims=self.dims)
        values = as_stored(self.model, result.values)
        return (result if values is result.values else dataclasses.replace(result, values=values)), stats

    def origin(self, result):
        """Where `result`'s NaN/Inf comes from (an engine Finding, as `check` reports it), or None."""
        if all(np.isfinite(g).all() for g in result.grads.values() if g.dtype.kind == "f"):
            return None
        spec = self.spec
        return engine.nonfinite_origin(self.model, spec.y, spec.xs, spec.zs, self.feeds, device=self.device,
                                       dtype=self.dtype, seed=self.seed, dims=self.dims)


@dataclass(frozen=True)
class ValuesJob:
    """Forward values at the session's feeds, device and dtype (`values_generation` names them).

    `names` empty: every value of the graph from one pass, so that later cursor moves find theirs
    already computed; else only those (a model whose intermediates would not fit VALUES_BUDGET)."""

    model: engine.Model
    feeds: dict[str, np.ndarray]
    names: tuple[str, ...]
    device: str
    dtype: str
    generation: int

    def run(self) -> dict[str, np.ndarray]:
        if not self.names:
            return self.model.run_all(self.feeds, device=self.device, dtype=self.dtype)
        found = {n: self.feeds[n] for n in self.names if n in self.feeds}
        found.update(stored_weights(self.model, [n for n in self.names if n not in found], self.dtype))
        rest = [n for n in self.names if n not in found]
        blocked = self.model.blocked(rest, list(self.feeds))  # the inspector says why these have no value
        rest = [n for n in rest if n not in blocked]
        if rest:
            found.update(self.model.run(self.feeds, outputs=rest, device=self.device, dtype=self.dtype))
        return found


@dataclass(frozen=True)
class CheckJob:
    model: engine.Model
    spec: engine.GradientSpec
    feeds: dict[str, np.ndarray]
    device: str
    options: CheckOptions
    generation: int
    dims: dict[str, int] = field(default_factory=dict)

    def run(self, progress: Callable | None = None, should_stop: Callable | None = None):
        o, spec = self.options, self.spec
        return engine.check(self.model, spec.y, spec.xs, spec.zs, feeds=self.feeds, mode=o.mode, order=o.order,
                            rtol=o.rtol, atol=o.atol, seed=o.seed, per_node=o.per_node, device=self.device,
                            progress=progress, should_stop=should_stop, dims=self.dims)


def intermediate_bytes(graph, dims=None) -> int:
    """What every node output would take in float64, by declared shapes with the symbolic dims at
    their sizes in `dims` (an unknown dim counts 1): at batch 40 and seq 32 GPT-2's pass is 1,280
    times what it is with both at 1, and held whole it would have been several GB."""
    dims = dims or {}
    total = 0
    for node in graph.nodes:
        for t in node.output:
            info = graph.types.get(t) if t else None
            if info is not None and info.shape is not None:
                # math.prod: np.prod's ~35 us a call made this ~80 ms of the main thread on GPT-2
                total += 8 * math.prod(d if isinstance(d, int) and d > 0 else dims.get(d, 1) if isinstance(d, str)
                                       else 1 for d in info.shape)
    return total


def _exact_upcast(own, dtype) -> bool:
    """`own` (a weight's torch dtype) goes into float `dtype` (a numpy or torch dtype, or its name)
    without rounding: float16 or bfloat16 into float32, any of them into float64."""
    if dtype is None or not own.is_floating_point:
        return False
    wanted = np.dtype(str(dtype).removeprefix("torch."))
    return wanted.kind == "f" and wanted.itemsize in (4, 8) and wanted.itemsize > own.itemsize


def stored_weights(model: engine.Model, names, dtype) -> dict[str, np.ndarray]:
    """The weights among `names` whose values in `dtype` are exactly theirs as stored: those arrays,
    sharing the model's memory, instead of a copy cast up (GPT-2's embedding: 0.29 GB in float64)."""
    if dtype is None:
        return {}
    weights = model.graph.initializers
    constants = model.constants()
    return {n: read_only(to_numpy(constants[n])) for n in names
            if n in weights and _exact_upcast(constants[n].dtype, dtype)}


def as_stored(model: engine.Model, values: dict) -> dict:
    """`values` with each weight cast up exactly (a gradient's xs as used) replaced by the weight as
    stored; `values` itself when there is none."""
    stored = {}
    for n, v in values.items():
        if isinstance(v, np.ndarray):
            stored.update(stored_weights(model, [n], v.dtype))
    return {**values, **stored} if stored else values
