"""Compile a graph slice into a flat list of steps over integer slots, then run it many times.

A Plan is built once per (sources, targets, device, dtype): constants are converted and placed
on the device at build time, attributes become keyword arguments, and each call walks a list.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import attributes
from .errors import ExecutionError, FeedError, OnnxGradError, UnsupportedOpError
from .loader import TRAINING_DOMAIN, GraphIndex
from .registry import require


@dataclass(frozen=True, eq=False)
class Step:
    node_index: int
    name: str
    op_type: str
    fn: Callable
    in_slots: tuple[int | None, ...]
    out_slots: tuple[int | None, ...]
    kwargs: dict
    free: tuple[int, ...]  # slots whose last reader is this step


def needed_nodes(graph: GraphIndex, sources: set[str], targets: Sequence[str]) -> tuple[list[int], list[str]]:
    """Node indices (topological) that compute `targets` from `sources`, and the unfed graph inputs met."""
    needed: set[int] = set()
    missing: list[str] = []
    seen: set[str] = set()
    stack = list(targets)
    while stack:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in sources:
            continue
        if t in graph.producer:
            i = graph.producer[t]
            if i not in needed:
                needed.add(i)
                stack.extend(graph.nodes[i].input)
        elif t not in graph.initializers:
            missing.append(t)
    return sorted(needed), missing


class Plan:
    """Runs the nodes that compute `targets` from `sources` (in that order) plus constants."""

    def __init__(self, graph: GraphIndex, sources: Sequence[str], targets: Sequence[str], *,
                 device: torch.device, float_dtype: torch.dtype | None, constants: dict[str, torch.Tensor],
                 gradient_step: Callable | None = None, keep_all: bool = False):
        self.graph = graph
        self.sources = tuple(sources)
        self.targets = tuple(targets)
        self.device = device
        self.float_dtype = float_dtype
        order, missing = needed_nodes(graph, set(sources), targets)
        if missing:
            raise FeedError(f"no value for graph input(s) {', '.join(map(repr, sorted(missing)))}: feed them")
        self.node_indices = tuple(order)
        slot: dict[str, int] = {}

        def slot_of(name: str) -> int:
            if name not in slot:
                slot[name] = len(slot)
            return slot[name]

        for s in self.sources:
            slot_of(s)
        template: dict[int, torch.Tensor] = {}
        src = set(self.sources)
        steps = []
        for i in order:
            node = graph.nodes[i]
            in_slots = []
            for t in node.input:
                if not t:
                    in_slots.append(None)
                    continue
                if t not in src and t not in graph.producer:
                    template[slot_of(t)] = constants[t]
                in_slots.append(slot_of(t))
            while in_slots and in_slots[-1] is None:
                in_slots.pop()
            # An output that is also a source was fed by the caller: the node must not overwrite it.
            out_slots = tuple(None if (not t or t in src) else slot_of(t) for t in node.output)
            if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
                if gradient_step is None:
                    raise OnnxGradError("Gradient nodes need a gradient_step factory")
                fn, kwargs = gradient_step(node), {}
            else:
                fn, kwargs = bind(node, graph.opset(node.domain), graph.node_names[i], device, float_dtype)
            steps.append([i, graph.node_names[i], node.op_type, fn, tuple(in_slots), out_slots, kwargs])
        self.slot = slot
        self.names = [None] * len(slot)
        for name, k in slot.items():
            self.names[k] = name
        self.source_slots = tuple(slot[s] for s in self.sources)
        for t in self.targets:
            if t not in slot:  # a target that is a constant, e.g. an initializer listed as output
                template[slot_of(t)] = constants[t]
                self.names.append(t)
        self.target_slots = tuple(slot[t] for t in self.targets)
        self._template = [template.get(k) for k in range(len(slot))]
        self.steps = self._with_frees(steps, keep_all)

    def _with_frees(self, raw_steps, keep_all: bool) -> tuple[Step, ...]:
        last: dict[int, int] = {}
        for k, raw in enumerate(raw_steps):
            for s in raw[4]:
                if s is not None:
                    last[s] = k
        keep = set(self.target_slots) | {k for k, v in enumerate(self._template) if v is not None}
        frees: list[list[int]] = [[] for _ in raw_steps]
        if not keep_all:
            for s, k in last.items():
                if s not in keep:
                    frees[k].append(s)
        return tuple(Step(*raw, free=tuple(f)) for raw, f in zip(raw_steps, frees))

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Values of `targets`, given values of `sources` in order."""
        env = self._execute(inputs, free=True)
        return [env[s] for s in self.target_slots]

    def run_all(self, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every value the plan computes or reads, by tensor name (for inspection and per-node checks)."""
        env = self._execute(inputs, free=False)
        return {self.names[k]: v for k, v in enumerate(env) if v is not None}

    def _execute(self, inputs, free: bool) -> list:
        if len(inputs) != len(self.source_slots):
            raise FeedError(f"plan expects {len(self.source_slots)} input values, got {len(inputs)}")
        env = list(self._template)
        for s, v in zip(self.source_slots, inputs):
            env[s] = v
        step = None
        try:
            for step in self.steps:
                out = step.fn(*[None if k is None else env[k] for k in step.in_slots], **step.kwargs)
                if len(step.out_slots) == 1:
                    if step.out_slots[0] is not None:
                        env[step.out_slots[0]] = out[0] if isinstance(out, tuple) else out
                else:
                    for k, v in zip(step.out_slots, out):
                        if k is not None:
                            env[k] = v
                if free:
                    for k in step.free:
                        env[k] = None
        except OnnxGradError as exc:
            if step is None or str(exc).startswith("node "):
                raise
            raise type(exc)(f"node {step.name!r} ({step.op_type}): {exc}") from None
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            if step is None:
                raise
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutionError(f"node {step.name!r} ({step.op_type}) failed: {msg}") from exc
        return env


def bind(node, opset: int, name: str, device: torch.device, float_dtype):
    """The registered function for `node` and its keyword arguments (attributes plus context)."""
    impl = require(node.domain, node.op_type, opset, name)
    accepted = impl.accepted_attributes
    kwargs = {}
    for attr in node.attribute:
        if accepted is not None and attr.name not in accepted:
            raise UnsupportedOpError(f"node {name!r}: {node.op_type} attribute {attr.name!r} is not supported")
        kwargs[attr.name] = attributes.convert(attr, device, float_dtype)
    context = {"n_outputs": len(node.output), "device": device, "float_dtype": float_dtype}
    for ctx in impl.context:
        kwargs[ctx] = context[ctx]
    return impl.fn, kwargs
