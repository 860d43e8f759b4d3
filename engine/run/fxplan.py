"""A Plan compiled into one `torch.fx.GraphModule`: the steps become straight-line Python.

The interpreter (`Plan.interpret`) walks a list of steps and, per node, builds an argument list,
unpacks outputs and clears dead slots in Python. The module generated here calls the very same
registered functions with the very same arguments in the same order, so its results are the
interpreter's bit for bit; only the bookkeeping between the calls is gone (fx also drops each
value after its last use, as the interpreter's `free` lists do).

Every constant (initializers, attribute values, context such as `device`) is passed to the
generated function as a positional argument after the sources, so nothing is looked up by name
at call time and no value needs a source-code spelling. Ops with Python-side control flow or
data-dependent shapes (If, Loop, Scan, sequences, strings, Unique, NonZero...) are ordinary
opaque calls here: they run exactly as in the interpreter.

How each step's result is unpacked (one value, a tuple holding one value, or n values) is taken
from one interpreted run, so `Plan` builds the module on its second run; under torch.compile,
which traces through small helpers at no cost, generic unpacking lets the first run compile. A call that raises is
re-run by the interpreter, which names the failing node in its error.
"""
from __future__ import annotations

import operator
import warnings
from typing import Sequence

import torch
import torch.fx
from torch.fx.graph import _is_from_torch

from .cast_at_use import cast_one

ALL = "all"  # `outputs=ALL`: return every slot's value (Plan.run_all), not only the targets


class FxPlan:
    """`plan`'s steps as one GraphModule; call with the source values in order."""

    def __init__(self, plan, steps: Sequence, shapes: Sequence[int] | None, outputs=None, compile: bool = False,
                 seen_shapes: dict | None = None):
        graph = torch.fx.Graph()
        env: dict[int, torch.fx.Node | None] = {}
        constants: list = []
        known = {k: v for k, v in enumerate(plan._template) if v is not None}  # slot -> constant value

        def placeholder(name: str) -> torch.fx.Node:
            return graph.placeholder(name)

        for k in plan.source_slots:
            env[k] = placeholder(f"s{k}")
            known.pop(k, None)
        folded = _fold(steps, known, seen_shapes or {})
        for k, value in known.items():
            env[k] = placeholder(f"c{k}")
            constants.append(value)
        kwarg_nodes: list[dict] = []
        for i, step in enumerate(steps):
            kw = {}
            for name, value in step.kwargs.items() if i not in folded else ():
                kw[name] = placeholder(f"k{len(constants)}")
                constants.append(value)
            kwarg_nodes.append(kw)
        for i, (step, kw) in enumerate(zip(steps, kwarg_nodes)):
            if i in folded:
                if i in (seen_shapes or {}):  # its value stands only while the input keeps that shape
                    graph.call_function(_same_shape, (env[step.in_slots[0]], seen_shapes[i][0]))
                continue
            args = tuple(None if k is None else env.get(k) for k in step.in_slots)
            if step.cast:  # a constant held in its own dtype (engine/run/cast_at_use.py)
                args = tuple(graph.call_function(cast_one, (a, plan.float_dtype)) if j in step.cast else a
                             for j, a in enumerate(args))
            out = graph.call_function(_nameable(step.fn), args, kw)
            # shape -1: the function returned the value itself; 1 (one output): a tuple, unwrapped as
            # the interpreter does, checking each time; n: n values. None (not seen run): generic.
            shape = None if shapes is None else shapes[i]
            if len(step.out_slots) == 1:
                if step.out_slots[0] is not None:
                    env[step.out_slots[0]] = out if shape == -1 else graph.call_function(_first, (out,))
            else:
                for j, k in enumerate(step.out_slots if shape is None else step.out_slots[:shape]):
                    if k is not None:
                        env[k] = graph.call_function(operator.getitem if shape is not None else _nth, (out, j))
        if outputs == ALL:
            self.slots = tuple(k for k in range(len(plan.names)) if k in env)
        else:
            self.slots = plan.target_slots
        graph.output(tuple(env.get(k) for k in self.slots))
        self.module = torch.fx.GraphModule(torch.nn.Module(), graph, class_name="CompiledPlan")
        self.constants = tuple(constants)
        self.forward = self.module.forward
        self.compiled = False
        if compile:
            self._compile()

    def __call__(self, inputs: Sequence) -> tuple:
        return self.forward(*inputs, *self.constants)

    @property
    def ShapeChanged(self) -> type:  # noqa: N802 - what `Plan` catches, without importing this module per call
        return ShapeChanged

    def _compile(self) -> None:
        """torch.compile on top of the module; on any failure, the plain module and one warning."""
        try:
            compiled = torch.compile(self.module, dynamic=False)
        except Exception as exc:  # noqa: BLE001 - optional speed-up, never required
            _warn_once(exc)
            return
        plain = self.forward

        def first_call(*values):
            try:
                out = compiled(*values)
            except Exception as exc:  # noqa: BLE001 - no compiler, inductor limits, unsupported op...
                _warn_once(exc)
                self.forward = plain
                return plain(*values)
            self.forward = compiled
            self.compiled = True
            return out

        self.forward = first_call


# Never evaluated ahead of time: their values change from call to call.
RANDOM = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli",
                    "Multinomial", "Dropout"})
SHAPE_OPS = frozenset({"Shape", "Size"})


class ShapeChanged(Exception):
    """A folded Shape/Size met an input of another shape than when it was folded."""


def _same_shape(x, shape: tuple) -> None:
    if tuple(x.shape) != shape:
        raise ShapeChanged


def _fold(steps, known: dict, seen_shapes: dict) -> set[int]:
    """Evaluate now the steps whose inputs are all constants (Constant nodes, shape arithmetic on
    initializers...) with the same function and arguments the run would use, so their values are
    the run's; add them to `known`. A Shape/Size seen on the first run counts as constant under a
    guard on its input's shape. Returns the folded step indices."""
    folded = set()
    for i, step in enumerate(steps):
        if i in seen_shapes:
            value = seen_shapes[i][1]
        elif (step.op_type in RANDOM or step.op_type in SHAPE_OPS or getattr(step.fn, "no_fold", False) or step.cast
              or any(k is not None and k not in known for k in step.in_slots)):
            continue
        else:
            try:
                with torch.no_grad():
                    value = step.fn(*[None if k is None else known[k] for k in step.in_slots], **step.kwargs)
            except Exception:  # noqa: BLE001 - left to fail at run time, where the error names the node
                continue
        if len(step.out_slots) == 1:
            values = [value[0] if isinstance(value, tuple) else value]
        else:
            values = list(value)
        if len(values) < len(step.out_slots) or not all(isinstance(v, torch.Tensor) for v in values):
            continue  # sequences and absent outputs: left to the run
        folded.add(i)
        for k, v in zip(step.out_slots, values):
            if k is not None:
                known[k] = v
    return folded


def _nameable(fn):
    """`fn`, or a wrapper when fx would call it by a torch name that may be another object: a
    function that claims torch as its module (functools.wraps of torch.tanh) is emitted by
    qualified name, which would silently call torch's own function instead."""
    if not _is_from_torch(fn):
        return fn

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    return call


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _nth(out, j: int):
    """Output j of a multi-output step, None when it returned fewer (the interpreter's zip)."""
    return out[j] if j < len(out) else None


_warned: set[str] = set()


def _warn_once(exc: Exception) -> None:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"torch.compile unavailable, running the fx module instead: {msg[:200]}",
                      RuntimeWarning, stacklevel=3)
