"""Run a gradient and record what flows along every edge of its backward graph.

The prepared gradient's forward pass is walked node by node (`PreparedGradient.forward`) with two
additions: a tensor hook on every active tensor (its whole gradient) and, where a tensor fans
out, a separate alias per consumer so that each consumer's partial gradient can be hooked before
autograd sums them. The torch autograd
functions that implement each node's VJP are read from the `grad_fn` graph between the node's
outputs and its inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from ..dtypes import to_numpy
from ..gradient.prepared import GradientObserver, GradientResult
from ..run.pacing import pause_point
from .backward import BackwardEdge, BackwardGraph, build_backward_graph


@dataclass(frozen=True)
class TensorStats:
    """Summary of one gradient tensor. norm/min/max are over its finite entries (0 when none)."""

    shape: tuple[int, ...]
    dtype: str
    norm: float
    min: float
    max: float
    nan_count: int
    inf_count: int

    @property
    def finite(self) -> bool:
        return self.nan_count == 0 and self.inf_count == 0

    @classmethod
    def of(cls, value) -> "TensorStats":
        """In the tensor's own dtype where that is exact (min, max, the counts); the norm from float64
        pieces of a million elements. A float64 copy of every edge's gradient, twice over (and a
        third for the finite ones) made GPT-2's stats run 7 times as long as its gradient."""
        t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        shape, dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")
        t = t.to("cpu")
        if not t.is_floating_point():
            t = t.to(torch.float64)
        finite = torch.isfinite(t)
        if bool(finite.all()):
            nan = inf = 0
            finite = t.reshape(-1)
        else:
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            finite = t[finite]
        if finite.numel() == 0:
            return cls(shape, dtype, 0.0, 0.0, 0.0, nan, inf)
        squares = sum(_norm_squared(piece) for piece in finite.split(1 << 20))
        return cls(shape, dtype, squares ** 0.5, float(finite.min()), float(finite.max()), nan, inf)

    def describe(self) -> str:
        bad = "" if self.finite else f" nan={self.nan_count} inf={self.inf_count}"
        dims = "×".join(map(str, self.shape)) or "scalar"
        return f"[{dims}] ‖g‖={self.norm:.4g} min={self.min:.4g} max={self.max:.4g}{bad}"


def _norm_squared(piece: torch.Tensor) -> float:
    pause_point()  # a big gradient's pieces (the token embedding's: 62 of them) are milliseconds each
    return float(torch.linalg.vector_norm(piece.to(torch.float64))) ** 2


@dataclass(frozen=True, eq=False)
class GraphStats:
    """Per-edge gradient stats of one run; `None` where no gradient flowed (e.g. through Shape)."""

    backward: BackwardGraph
    edges: Mapping[str, TensorStats | None]  # BackwardEdge.key -> stats
    tensors: Mapping[str, TensorStats | None]  # forward tensor -> stats of dy/d(tensor)
    torch_functions: Mapping[int, tuple[str, ...]]  # forward node index -> autograd function names
    gradients: Mapping[str, np.ndarray] = field(default_factory=dict)  # edge key -> value, if kept

    def for_edge(self, edge: BackwardEdge) -> TensorStats | None:
        return self.edges.get(edge.key)


def gradient_with_stats(model, y: str, xs, zs=(), feeds: Mapping[str, object] | None = None, dy=None,
                        device="cpu", dtype=None, *, seed: int = 0, keep_gradients: bool = False,
                        dims: Mapping[str, int] | None = None) -> tuple[GradientResult, GraphStats]:
    """`Model.gradient` plus the stats of every backward edge and node (same arguments and result).

    The same gradient call as `Model.gradient` (`Model.gradient_call`), its forward pass walked
    node by node through an observer. The gradients equal Model.gradient's up to rounding: the
    per-consumer aliases can change the order in which autograd sums contributions at a fan-out
    (an ulp in float64).
    """
    feeds = dict(feeds or {})
    call = model.gradient_call(y, xs, zs, feeds, device=device, dtype=dtype)
    recorder = _Recorder(build_backward_graph(model, call.spec), keep_gradients)
    observer = _Observer(recorder)
    tensors, values = call.inputs(feeds, seed, dims)
    prepared = call.prepared
    out = prepared.backward(prepared.forward(*tensors, observer=observer), dy, observer=observer)
    return call.result(out, values, dy is not None), recorder.finish()


class _Recorder:
    def __init__(self, backward: BackwardGraph, keep: bool):
        self.backward = backward
        self.keep = keep
        self.tensor_stats: dict[str, TensorStats] = {}
        self.tensor_values: dict[str, np.ndarray] = {}
        self.partial_stats: dict[tuple[int, str], TensorStats] = {}
        self.partial_values: dict[tuple[int, str], np.ndarray] = {}
        self.functions: dict[int, tuple[str, ...]] = {}
        fan_out: dict[str, int] = {}
        for e in backward.edges:
            if e.partial:
                fan_out[e.tensor] = fan_out.get(e.tensor, 0) + 1
        self.fanned = frozenset(fan_out)
        self.active_nodes = frozenset(backward.active_nodes)

    def tensor_gradient(self, name: str, grad: torch.Tensor) -> None:
        pause_point()  # between two of the backward pass's nodes: a front end may go first
        self.tensor_stats[name] = TensorStats.of(grad)
        if self.keep:
            self.tensor_values[name] = to_numpy(grad.detach())

    def hook_tensor(self, name: str, value) -> None:
        if isinstance(value, torch.Tensor) and value.requires_grad and name in self.backward.active_tensors:
            value.register_hook(lambda g, name=name: self.tensor_gradient(name, g))

    def alias_for(self, node_index: int, name: str, value):
        """A distinct autograd node per consumer of a fanned-out tensor, to see its partial gradient."""
        if (node_index not in self.active_nodes or name not in self.fanned
                or not isinstance(value, torch.Tensor) or not value.requires_grad):
            return value
        alias = value.view_as(value)
        key = (node_index, name)

        def record(g, key=key):
            self.partial_stats[key] = TensorStats.of(g)
            if self.keep:
                self.partial_values[key] = to_numpy(g.detach())

        alias.register_hook(record)
        return alias

    def finish(self) -> GraphStats:
        edges, values = {}, {}
        for e in self.backward.edges:
            if e.partial:
                key = (int(e.source[1:]), e.tensor)
                edges[e.key] = self.partial_stats.get(key)
                if key in self.partial_values:
                    values[e.key] = self.partial_values[key]
            else:
                edges[e.key] = self.tensor_stats.get(e.tensor)
                if e.tensor in self.tensor_values:
                    values[e.key] = self.tensor_values[e.tensor]
        tensors = {t: self.tensor_stats.get(t) for t in sorted(self.backward.active_tensors)}
        return GraphStats(self.backward, edges, tensors, dict(self.functions), values)


def _autograd_functions(outputs, inputs) -> tuple[str, ...]:
    """Names of the grad_fn nodes between a step's outputs and its inputs (the VJP torch runs)."""
    # Every grad_fn compared by id is held: an id is unique among live objects only, and torch
    # wraps a node in a new Python object once the last wrapper is gone (on torch 2.11 a freed
    # input's wrapper id came back as the Gemm's own, which then looked like a stop).
    held = [t.grad_fn for t in inputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    stop = {id(fn) for fn in held}
    names: dict[str, None] = {}
    seen: set[int] = set()
    stack = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    while stack and len(seen) < 10_000:
        fn = stack.pop()
        if fn is None or id(fn) in seen or id(fn) in stop:
            continue
        held.append(fn)
        seen.add(id(fn))
        name = type(fn).__name__
        if name == "AccumulateGrad":
            continue
        names[name] = None
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return tuple(names)


class _Observer(GradientObserver):
    """Hooks every tensor of the run, gives each consumer its own alias of what it reads, records
    the autograd functions behind each active node, and the seed as y's gradient."""

    def __init__(self, recorder: _Recorder):
        self.recorder = recorder

    def source(self, name, value):
        self.recorder.hook_tensor(name, value)
        return value

    def seed(self, name, value):
        if name in self.recorder.backward.active_tensors:
            self.recorder.tensor_gradient(name, value)

    def arguments(self, step, names, args):
        aliases: dict[str, object] = {}  # one alias per tensor even when read twice (Mul(E, E))
        for name, value in zip(names, args):
            if name is not None and name not in aliases:
                aliases[name] = self.recorder.alias_for(step.node_index, name, value)
        return [None if name is None else aliases[name] for name in names]

    def outputs(self, step, args, names, outs):
        if step.node_index in self.recorder.active_nodes:
            self.recorder.functions[step.node_index] = _autograd_functions(outs, args)
        # An op may hand back its input object (Identity); a view keeps the two tensors' hooks apart.
        outs = [o.view_as(o) if isinstance(o, torch.Tensor) and any(o is a for a in args) else o for o in outs]
        for name, value in zip(names, outs):
            if name is not None:
                self.recorder.hook_tensor(name, value)
        return outs
