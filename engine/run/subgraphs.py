"""Control flow's subgraphs: what an If, Loop or Scan step receives as `scope=`, and the plans that
run its subgraphs (compiled once per subgraph, with the enclosing graph's values read by name)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..errors import OnnxGradError

if TYPE_CHECKING:
    from .plan import Plan


class Scope:
    """What a control-flow op receives as `scope=`: the enclosing graph's values that its
    subgraphs read by name, and `run(subgraph, inputs)`, which executes one (compiled once)."""

    def __init__(self, outer: dict, compiler: "SubgraphCompiler"):
        self.outer = outer
        self._compiler = compiler

    def run(self, subgraph, inputs: Sequence) -> list:
        plan, n_inputs = self._compiler.plan(subgraph)
        if len(inputs) != n_inputs:
            raise OnnxGradError(f"subgraph {subgraph.name!r} takes {n_inputs} inputs, got {len(inputs)}")
        return plan.run(list(inputs) + [self.outer[n] for n in plan.sources[n_inputs:]])


def scoped(fn: Callable, n_explicit: int, outer: tuple[str, ...], compiler: "SubgraphCompiler") -> Callable:
    def step(*values, **kwargs):
        scope = Scope(dict(zip(outer, values[n_explicit:])), compiler)
        return fn(*values[:n_explicit], scope=scope, **kwargs)

    step.no_fold = True  # control flow: never evaluated ahead of a run
    return step


class SubgraphCompiler:
    """Plans for a node's subgraphs: their own inputs first, then the outer names they read."""

    def __init__(self, opsets: dict[str, int], device: torch.device, float_dtype):
        self.opsets, self.device, self.float_dtype = opsets, device, float_dtype
        self._plans: dict[int, tuple] = {}

    def plan(self, g) -> tuple["Plan", int]:
        entry = self._plans.get(id(g))
        if entry is None:
            entry = self._plans[id(g)] = (*self._compile(g), g)  # holding g keeps its id unique
        return entry[0], entry[1]

    def _compile(self, g) -> tuple["Plan", int]:
        from onnx import ModelProto

        from ..modelfile.index import graph_free_names, index
        from .plan import Plan  # lazy cycle: a subgraph's plan is a Plan
        from .values import tensor_from_proto

        free = graph_free_names(g)
        model = ModelProto()
        model.graph.CopyFrom(g)
        for name in free:  # declared as inputs, so the index accepts reads from the enclosing scope
            model.graph.input.add().name = name
        for domain, version in self.opsets.items():
            imp = model.opset_import.add()
            imp.domain, imp.version = domain, version
        sub = index(model)
        constants = {n: tensor_from_proto(t, self.device, self.float_dtype) for n, t in sub.initializers.items()}
        inputs = [i.name for i in g.input]
        plan = Plan(sub, inputs + list(free), [o.name for o in g.output], device=self.device,
                    float_dtype=self.float_dtype, constants=constants)
        return plan, len(inputs)
