"""Where forward mode cannot go: an op torch's forward AD does not cover, and a step that drops a
tangent it was given (a value rebuilt outside autograd: numpy, `detach`, a nested Gradient node).

torch says the first in an exception ("Trying to use forward AD with X that does not support it",
"You must implement the jvp function for custom autograd.Function"); the second it does not say at
all: the output simply has no tangent, and J·v would come out silently zero along that path. So the
first call of a prepared JVP walks the steps under `TangentWatch`, which refuses, naming the node,
any step that reads a tangent at an input ONNX calls differentiable and gives none back, unless
the op's record declares its derivative zero (Hardmax, Bernoulli: piecewise constant or a sample),
where no tangent is the right tangent and reverse mode sends back zero too.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from ..errors import ExecutionError, ForwardModeError
from ..gradient.differentiable import carries_derivative
from ..run.plan import StepObserver

_MISSING = ("forward AD", "jvp function", "forward-mode AD", "forward mode AD", "forward grad")


def missing_rule(exc: BaseException) -> str | None:
    """torch's reason when `exc` (or what it wraps) says an op has no forward-mode rule; else None."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, NotImplementedError) or (isinstance(exc, RuntimeError) and not isinstance(exc, ExecutionError)):
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if any(m in text for m in _MISSING):
                return text
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def refusal(exc: ExecutionError) -> ForwardModeError | None:
    """The one-line ForwardModeError for a step that failed for want of a forward rule (None otherwise).
    `exc` names the node already ("node 'n' (Op) failed: ..."): the reason replaces torch's text."""
    why = missing_rule(exc)
    if why is None:
        return None
    where = str(exc).split(" failed:", 1)[0] if " failed:" in str(exc) else "a node"
    custom = "jvp function" in why
    hint = "register a jvp beside its vjp (register_op_with_vjp(..., jvp=...))" if custom \
        else "torch's forward AD does not cover it"
    return ForwardModeError(f"{where} has no forward-mode rule (JVP): {hint} ({_short(why)})",
                            getattr(exc, "node_index", None), custom)


def _short(text: str) -> str:
    return text.split(" because ", 1)[0].split(". Please", 1)[0].rstrip(".")


def tangent_of(value) -> torch.Tensor | None:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    return fwAD.unpack_dual(value).tangent


class TangentWatch(StepObserver):
    """Refuses a step that reads a tangent where ONNX says a derivative flows and writes none."""

    def __init__(self, graph):
        self.graph = graph

    def outputs(self, step, args, names, outs):
        if any(tangent_of(o) is not None for o in outs):
            return outs
        if not any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs):
            return outs  # integer or bool results: nothing to carry
        node = self.graph.nodes[step.node_index] if step.node_index is not None else None
        if node is not None and declares_zero(node.domain or "", node.op_type):
            return outs
        for k, a in enumerate(args):
            if tangent_of(a) is None:
                continue
            tensor = node.input[k] if node is not None and k < len(node.input) else ""
            if node is None or k >= len(node.input) or carries_derivative(self.graph, step.node_index, k, tensor):
                raise ForwardModeError(
                    f"node {step.name!r} ({step.op_type}) has no forward-mode rule (JVP): it reads a tangent at "
                    f"input {k} ({tensor or 'an outer value'!r}) and gives none back, so J·v would be silently "
                    "zero along it", step.node_index)
        return outs


def declares_zero(domain: str, op_type: str) -> bool:
    """The op's record says no derivative flows through it: `no_gradient`, or a rule whose every
    line is `dX = 0` (engine/oprecord.py)."""
    from ..registry import record

    rec = record(op_type, domain)
    if rec is None:
        return False
    if rec.no_gradient:
        return True
    lines = rec.rule if isinstance(rec.rule, tuple) else ()
    return bool(lines) and all(line is None or line.split("#", 1)[0].split("=", 1)[-1].strip() == "0"
                               for line in lines)
