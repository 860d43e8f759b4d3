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
from one interpreted run, so `Plan` builds the module on its second run. A call that raises is
re-run by the interpreter, which names the failing node in its error.
"""
from __future__ import annotations

import operator
import warnings
from typing import Sequence

import torch
import torch.fx
from torch.fx.graph import _is_from_torch

ALL = "all"  # `outputs=ALL`: return every slot's value (Plan.run_all), not only the targets


class FxPlan:
    """`plan`'s steps as one GraphModule; call with the source values in order."""

    def __init__(self, plan, shapes: Sequence[int], outputs=None, compile: bool = False):
        graph = torch.fx.Graph()
        env: dict[int, torch.fx.Node | None] = {}
        constants: list = []

        def placeholder(name: str) -> torch.fx.Node:
            return graph.placeholder(name)

        for k in plan.source_slots:
            env[k] = placeholder(f"s{k}")
        for k, value in enumerate(plan._template):
            if value is not None and k not in env:
                env[k] = placeholder(f"c{k}")
                constants.append(value)
        kwarg_nodes: list[dict] = []
        for step in plan.steps:
            kw = {}
            for name, value in step.kwargs.items():
                kw[name] = placeholder(f"k{len(constants)}")
                constants.append(value)
            kwarg_nodes.append(kw)
        for step, kw, shape in zip(plan.steps, kwarg_nodes, shapes):
            args = tuple(None if k is None else env.get(k) for k in step.in_slots)
            out = graph.call_function(_nameable(step.fn), args, kw)
            if len(step.out_slots) == 1:
                # shape -1: the function returned the value itself; else a tuple (unwrapped as the
                # interpreter does, checking again each time).
                if step.out_slots[0] is not None:
                    env[step.out_slots[0]] = out if shape == -1 else graph.call_function(_first, (out,))
            else:
                for j, k in enumerate(step.out_slots[:shape]):
                    if k is not None:
                        env[k] = graph.call_function(operator.getitem, (out, j))
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


_warned: set[str] = set()


def _warn_once(exc: Exception) -> None:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"torch.compile unavailable, running the fx module instead: {msg[:200]}",
                      RuntimeWarning, stacklevel=3)
