"""Compile a graph slice into a flat list of steps over integer slots, then run it many times.

A Plan is built once per (sources, targets, device, dtype): constants are converted and placed
on the device at build time, attributes become keyword arguments. The first call walks the list
(the interpreter, the reference); later calls run the same steps compiled into one
`torch.fx.GraphModule` (engine/run/fxplan.py), optionally under `torch.compile`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..dtypes import type_clash
from ..errors import ExecutionError, FeedError, OnnxGradError, UnsupportedOpError
from ..modelfile.index import TRAINING_DOMAIN, GraphIndex, implicit_inputs, node_inputs
from ..registry import parameters, require
from . import attributes, fusion, lean
from .cast_at_use import cast_args, cast_where_read, converted, held_at_use, keeping_sources
from .guard import MemoryGuard, value_sized
from .pacing import pause_point
from .step_errors import STEP_ERRORS, step_error
from .subgraphs import SubgraphCompiler, scoped
from .validation import checked


@dataclass(frozen=True, eq=False)
class Step:
    """One node of a plan. An observer may read `node_index` (into `graph.nodes`), `name` (the
    node's) and `op_type`; the rest is how the plan runs it."""

    node_index: int
    name: str
    op_type: str
    fn: Callable
    in_slots: tuple[int | None, ...]
    out_slots: tuple[int | None, ...]
    kwargs: dict
    free: tuple[int, ...]  # slots whose last reader is this step
    cast: tuple[int, ...] = ()  # argument positions holding a constant cast where read (cast_at_use.py)


# "fx" (default): straight-line GraphModule after the first run; "interpret": the step list
# every time (the reference, and the "before" of benchmarks); "compile": fx under torch.compile.
MODES = ("fx", "interpret", "compile")
DEFAULT_MODE = os.environ.get("ONNXGRAD_PLAN", "fx")
# Fusion of exported GELU/attention chains (engine/run/fusion.py) in `run`/`interpret`; "0" turns it off.
FUSE = os.environ.get("ONNXGRAD_FUSE", "1") != "0"


def needed_nodes(graph: GraphIndex, sources: set[str], targets: Sequence[str]) -> tuple[list[int], list[str]]:
    """Node indices (topological) that compute `targets` from `sources`, and the unfed graph inputs met."""
    needed: set[int] = set()
    missing: list[str] = []
    seen: set[str] = set()
    stack = list(targets)
    popped = 0
    while stack:
        popped += 1
        if not popped & 1023:
            pause_point()
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
                stack.extend(node_inputs(graph.nodes[i]))
        elif t not in graph.initializers:
            missing.append(t)
    return sorted(needed), missing


class Plan:
    """Runs the nodes that compute `targets` from `sources` (in that order) plus constants.

    `steps` has one Step per node, in order (run_all, run_observed and every reader of the plan's
    nodes); `run_steps` is what run/interpret execute: GELU and attention chains fused unless
    fusion is off, and Relu/Conv keeping less for autograd (engine/run/lean.py, opt-in), unless
    the caller keeps every value (keep_all)."""

    def __init__(self, graph: GraphIndex, sources: Sequence[str], targets: Sequence[str], *,
                 device: torch.device, float_dtype: torch.dtype | None, constants: dict[str, torch.Tensor],
                 gradient_step: Callable | None = None, keep_all: bool = False, mode: str | None = None,
                 fuse: bool | None = None, lean_autograd: bool | None = None):
        mode = mode or DEFAULT_MODE
        if mode not in MODES:
            raise OnnxGradError(f"plan mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self._guard = MemoryGuard(self)
        self._shapes: dict[str, list[int]] = {}  # how each step's result unpacks, seen on the first run
        self._seen_shapes: dict[str, dict[int, tuple]] = {}
        self._fx: dict[str, object] = {}
        self.graph = graph
        self.sources = tuple(sources)
        self.targets = tuple(targets)
        self.device = device
        self.float_dtype = float_dtype
        order, missing = needed_nodes(graph, set(sources), targets)
        if missing:
            raise FeedError(f"no value for graph input(s) {', '.join(map(repr, sorted(missing)))}: feed them")
        self.node_indices = tuple(order)
        self._fed = frozenset(self.sources)
        self.cast_slots: set[int] = set()
        self.slot: dict[str, int] = {}
        for s in self.sources:
            self._slot_of(s)
        template: dict[int, torch.Tensor] = {}  # slot -> the constant it holds before any step runs
        steps = []
        for i in order:
            pause_point()
            steps.append(self._raw_step(i, template, constants, gradient_step))
        for t in self.targets:
            if t not in self.slot:  # a target that is a constant, e.g. an initializer listed as output
                template[self._slot_of(t)] = converted(constants[t], self.float_dtype)
        self.names = [None] * len(self.slot)
        for name, k in self.slot.items():
            self.names[k] = name
        self.source_slots = tuple(self.slot[s] for s in self.sources)
        self.target_slots = tuple(self.slot[t] for t in self.targets)
        self._template = [template.get(k) for k in range(len(self.slot))]
        self.steps = self._with_frees(steps, keep_all)
        self.run_steps = self.steps if keep_all else self._run_steps(steps, template, fuse, lean_autograd)

    def _slot_of(self, name: str) -> int:
        slot = self.slot.get(name)
        if slot is None:
            slot = self.slot[name] = len(self.slot)
        return slot

    def _input_slot(self, name: str, template: dict, constants) -> int:
        """The slot a node reads `name` from; a constant's is filled in `template`."""
        if name not in self._fed and name not in self.graph.producer:
            value, slot = constants[name], self._slot_of(name)
            if held_at_use(value, self.float_dtype):
                self.cast_slots.add(slot)
                template[slot] = value
            else:
                template[slot] = converted(value, self.float_dtype)
        return self._slot_of(name)

    def _raw_step(self, i: int, template: dict, constants, gradient_step) -> list:
        """Node i as [node_index, name, op_type, fn, in_slots, out_slots, kwargs] (a Step without `free`)."""
        graph, node = self.graph, self.graph.nodes[i]
        in_slots = [None if not t else self._input_slot(t, template, constants) for t in node.input]
        while in_slots and in_slots[-1] is None:
            in_slots.pop()
        # An output that is also a source was fed by the caller: the node must not overwrite it.
        out_slots = tuple(None if (not t or t in self._fed) else self._slot_of(t) for t in node.output)
        if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
            if gradient_step is None:
                raise OnnxGradError("Gradient nodes need a gradient_step factory")
            fn, kwargs = gradient_step(node), {}
        else:
            fn, kwargs = bind(node, graph.opset(node.domain), graph.node_names[i], self.device, self.float_dtype)
            if "scope" in parameters(fn):  # control flow: If, Loop, Scan
                outer = implicit_inputs(node)
                n_explicit = len(in_slots)
                in_slots += [self._input_slot(t, template, constants) for t in outer]
                fn = scoped(fn, n_explicit, outer, SubgraphCompiler(graph.opsets, self.device, self.float_dtype))
        return [i, graph.node_names[i], node.op_type, fn, tuple(in_slots), out_slots, kwargs]

    def _run_steps(self, steps: list, template: dict, fuse: bool | None, lean_autograd: bool | None
                   ) -> tuple[Step, ...]:
        """`steps` as run/interpret execute them: fused, and lean for autograd where asked."""
        run = steps
        graph_outputs = {self.slot[n] for n in self.graph.outputs if n in self.slot}
        protected = set(self.source_slots) | set(self.target_slots) | graph_outputs
        if FUSE if fuse is None else fuse:
            # fusion matches constants by value (GELU's sqrt 2): as the steps will read them, cast
            as_read = {k: converted(v, self.float_dtype) if k in self.cast_slots and v.numel() == 1 else v
                       for k, v in template.items()}
            run = fusion.fuse(run, protected, as_read)
        if lean.LEAN if lean_autograd is None else lean_autograd:
            run = lean.lean_steps(run, protected)
        return self.steps if run is steps else self._with_frees(run, False)

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
        symbols = self._guard.symbols
        return tuple(cast_where_read(Step(*value_sized(self.graph, self.float_dtype, checked(self.graph, raw), symbols),
                                          free=tuple(f)), self.cast_slots, self.float_dtype)
                     for raw, f in zip(raw_steps, frees))

    def run(self, inputs: Sequence[torch.Tensor], fused: bool = True) -> list[torch.Tensor]:
        """Values of `targets`, given values of `sources` in order. `fused=False`: node by node,
        for autograd graphs that are differentiated again (a fused attention's backward is not)."""
        if not fused and self.run_steps is not self.steps:
            env = self._execute(inputs, free=True, which="all")
            return [env[s] for s in self.target_slots]
        compiled = self._fx.get("targets")  # once built, only the number of inputs can disqualify it
        if compiled is None or len(inputs) != len(self.source_slots):
            compiled = self._compiled("targets", inputs)
        if compiled is not None:
            self._guard.check(self.run_steps, inputs, True)
            try:
                return list(self._call(compiled, "targets", inputs))
            except STEP_ERRORS:
                pass  # the interpreter below fails again and names the node
        return self.interpret(inputs)

    def interpret(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """`run` by walking the steps in Python: the reference the compiled module is tested against."""
        env = self._execute(inputs, free=True, which="targets")
        return [env[s] for s in self.target_slots]

    def run_all(self, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every value the plan computes or reads, by tensor name (for inspection and per-node checks)."""
        compiled = self._compiled("all", inputs)
        if compiled is not None:
            self._guard.check(self.steps, inputs, False)
            try:
                values = self._call(compiled, "all", inputs)
                compiled = self._fx["all"]
            except STEP_ERRORS:
                pass
            else:
                return {self.names[k]: v for k, v in zip(compiled.slots, values) if v is not None}
        return self.interpret_all(inputs)

    def interpret_all(self, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """`run_all` by walking the steps in Python (the reference)."""
        env = self._execute(inputs, free=False, which="all")
        return {self.names[k]: v for k, v in enumerate(env) if v is not None}

    def _call(self, compiled, which: str, inputs):
        with keeping_sources(bool(self.cast_slots)):
            try:
                return compiled(inputs)
            except compiled.ShapeChanged:  # inputs of new shapes: a module without shape-specialised folding
                compiled = self._fx[which] = self._build(which, seen_shapes=False)
                return compiled(inputs)

    def _build(self, which: str, seen_shapes: bool = True):
        from .fxplan import ALL, FxPlan

        key = self._key(which)
        return FxPlan(self, self._steps(which), self._shapes.get(key), ALL if which == "all" else None,
                      compile=self.mode == "compile", seen_shapes=self._seen_shapes.get(key) if seen_shapes else None)

    def _steps(self, which: str) -> tuple[Step, ...]:
        return self.run_steps if which == "targets" else self.steps

    def _key(self, which: str) -> str:
        """Where the first run's unpacking is kept: one entry when both step lists are the same."""
        return "targets" if self._steps(which) is self.run_steps else "all"

    def _compiled(self, which: str, inputs):
        """The fx module for `which` once a run has shown how each step's results unpack; else None."""
        if self.mode == "interpret" or len(inputs) != len(self.source_slots) or (
                self._key(which) not in self._shapes and self.mode != "compile"):
            return None
        compiled = self._fx.get(which)
        if compiled is None:
            compiled = self._fx[which] = self._build(which)
        return compiled

    def constants(self) -> dict[str, torch.Tensor]:
        """The constants the plan binds before any step runs (initializers and Constant values), by name."""
        return {self.names[k]: v for k, v in enumerate(self._template) if v is not None}

    def run_observed(self, inputs: Sequence[torch.Tensor], observer: "StepObserver", free: bool = False
                     ) -> list[torch.Tensor]:
        """`run`, with `observer` seeing (and able to replace) every value: tensor hooks, aliases.
        `free`: each value is dropped after its last reader (a plan built without keep_all)."""
        env = self._execute(inputs, free=free, which="all", observer=observer)
        return [env[s] for s in self.target_slots]

    def _execute(self, inputs, free: bool, which: str, observer: "StepObserver | None" = None) -> list:
        if len(inputs) != len(self.source_slots):
            raise FeedError(f"plan expects {len(self.source_slots)} input values, got {len(inputs)}")
        self._guard.check(self._steps(which), inputs, free)
        env = list(self._template)
        key = self._key(which)
        shapes = [] if key not in self._shapes and observer is None else None
        seen: dict[int, tuple] = {}  # Shape/Size steps: (input shape, value), folded under a guard
        for s, v in zip(self.source_slots, inputs):
            env[s] = v if observer is None else observer.source(self.names[s], v)
        last = [None, []]  # the step last started and its arguments, for the error
        try:
            with keeping_sources(bool(self.cast_slots)):
                self._walk(env, which, shapes, seen, observer, free, last)
        except STEP_ERRORS as exc:
            step, args = last
            if step is not None and not isinstance(exc, OnnxGradError):
                node = self.graph.nodes[step.node_index]
                clash = type_clash(node, self.graph.opset(node.domain), args)
                exc = ExecutionError(clash) if clash else exc
            raise step_error(step, exc, self._written(step)) from (None if isinstance(exc, OnnxGradError) else exc)
        if shapes is not None:
            self._shapes[key], self._seen_shapes[key] = shapes, seen
        return env

    def _written(self, step: Step | None) -> list[str]:
        return [] if step is None else [self.names[k] for k in step.out_slots if k is not None]

    def _walk(self, env: list, which: str, shapes, seen, observer, free: bool, last: list) -> None:
        """The steps in order over `env`."""
        for step in self._steps(which):
            pause_point()
            last[0] = step
            last[1] = args = [None if k is None else env[k] for k in step.in_slots]
            if observer is not None:
                args = observer.arguments(step, [None if k is None else self.names[k] for k in step.in_slots], args)
            if step.cast:
                last[1] = args = cast_args(args, step.cast, self.float_dtype)
            out = step.fn(*args, **step.kwargs)
            if shapes is not None:
                single = len(step.out_slots) == 1
                shapes.append((-1 if not isinstance(out, tuple) else 1) if single else len(out))
                if step.op_type in ("Shape", "Size") and isinstance(args[0], torch.Tensor):
                    seen[len(shapes) - 1] = (tuple(args[0].shape), out)
            if observer is not None:
                outs = [out[0] if isinstance(out, tuple) else out] if len(step.out_slots) == 1 else list(out)
                out = observer.outputs(step, args, [None if k is None else self.names[k] for k in step.out_slots],
                                       outs)
                for k, v in zip(step.out_slots, out):
                    if k is not None:
                        env[k] = v
            elif len(step.out_slots) == 1:
                if step.out_slots[0] is not None:
                    env[step.out_slots[0]] = out[0] if isinstance(out, tuple) else out
            else:
                for k, v in zip(step.out_slots, out):
                    if k is not None:
                        env[k] = v
            if free:
                for k in step.free:
                    env[k] = None


class StepObserver:
    """Hooks for a run walked node by node (`Plan.run_observed`, `PreparedGradient.forward`); each
    returns the value(s) the run goes on with, so an observer may replace them (a leaf, an alias)."""

    def source(self, name: str, value):
        """Each input of the run, by tensor name, before any node runs."""
        return value

    def arguments(self, step: Step, names: list[str | None], args: list) -> list:
        """A node's arguments (None for an omitted optional input) before it runs."""
        return args

    def outputs(self, step: Step, args: list, names: list[str | None], outs: list) -> list:
        """A node's outputs right after it ran on `args` (`names` None for one it does not write)."""
        return outs


def bind(node, opset: int, name: str, device: torch.device, float_dtype):
    """The registered function for `node` and its keyword arguments (attributes plus context)."""
    impl = require(node.domain, node.op_type, opset, name)
    accepted = impl.accepted_attributes
    kwargs = {}
    for attr in node.attribute:
        if accepted is not None and attr.name not in accepted:
            raise UnsupportedOpError(f"node {name!r}: {node.op_type} attribute {attr.name!r} is not supported",
                                     node.op_type, name)
        kwargs[attr.name] = attributes.convert(attr, device, float_dtype)
    context = {"n_outputs": len(node.output), "device": device, "float_dtype": float_dtype}
    for ctx in impl.context:
        kwargs[ctx] = context[ctx]
    return impl.fn, kwargs
