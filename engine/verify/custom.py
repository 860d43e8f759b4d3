"""Ops with a hand-written backward (SameDiff's doDiff): register, verify, unregister.

    def forward(a, b, *, alpha=1.0):            # inputs in ONNX order, attributes as keywords
        return alpha * a * b
    def vjp(grads, inputs, outputs, *, alpha=1.0):  # one gradient per input, None where none
        (g,), (a, b) = grads, inputs
        return alpha * g * b, alpha * g * a
    def jvp(tangents, inputs, outputs, *, alpha=1.0):  # optional: forward mode (J·v), one per output
        (ta, tb), (a, b) = tangents, inputs         # a tangent is None where its input carries none
        return alpha * ((0 if ta is None else ta * b) + (0 if tb is None else a * tb))
    handle = register_op_with_vjp("ScaledMul", forward, vjp, domain="com.example", jvp=jvp)
    report = check(model, ...)                 # the node is named when the VJP is wrong
    handle.unregister()                        # or: with register_op_with_vjp(...): ...

The pair becomes a torch.autograd.Function (functorch style, with a generated vmap rule, so the
verifier's batched perturbations and second-order checks go through it) and replaces whatever
the registry held for (domain, op_type) over the opsets from `since`; unregistering restores it.
Register before `engine.load`: a loaded Model has already bound its ops.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from .. import registry
from ..errors import OnnxGradError
from ..registry import OpImpl

_ACTIVE: dict[tuple[str, str, int], "CustomOp"] = {}


@dataclass
class CustomOp:
    """A live registration; `unregister()` (or leaving a `with` block) puts the previous one back."""

    domain: str
    op_type: str
    since: int
    impl: OpImpl
    replaced: tuple[OpImpl, ...]

    def unregister(self) -> None:
        unregister_op(self.op_type, domain=self.domain, since=self.since)

    def __enter__(self) -> "CustomOp":
        return self

    def __exit__(self, *exc) -> None:
        if _ACTIVE.get((self.domain, self.op_type, self.since)) is self:
            self.unregister()


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


# long: one autograd.Function per call, its forward, context, jvp and backward sharing the call's closure
def make_function(forward: Callable, vjp: Callable, name: str = "CustomOp", jvp: Callable | None = None) -> Callable:
    """fn(*inputs, **attrs) whose backward is `vjp(grads, inputs, outputs, **attrs)` and, when given,
    whose forward-mode rule is `jvp(tangents, inputs, outputs, **attrs)`; without one, forward mode
    stops at the node with a one-line ForwardModeError (engine/forward/rules.py), never a zero."""

    def apply(*inputs, **attrs):
        tensors = [i for i in inputs if isinstance(i, torch.Tensor)]
        where = [isinstance(i, torch.Tensor) for i in inputs]
        n_out = [1]
        multi = [False]

        def rebuild(ts):
            it = iter(ts)
            return [next(it) if w else i for w, i in zip(where, inputs)]

        class Function(torch.autograd.Function):
            generate_vmap_rule = True

            @staticmethod
            def forward(*ts):
                out = forward(*rebuild(ts), **attrs)
                multi[0] = isinstance(out, (tuple, list))
                out = _as_tuple(out)
                n_out[0] = len(out)
                return out

            @staticmethod
            def setup_context(ctx, ts, output):
                ctx.save_for_backward(*ts, *output)
                ctx.n_in = len(ts)
                if jvp is not None:
                    ctx.save_for_forward(*ts, *output)

            @staticmethod
            def jvp(ctx, *tangents):
                if jvp is None:
                    raise NotImplementedError("You must implement the jvp function for custom autograd.Function "
                                              "to use it with forward mode AD.")
                saved = ctx.saved_tensors
                ins, outs = saved[:ctx.n_in], saved[ctx.n_in:]
                tangent_of = iter(tangents)
                full = [next(tangent_of) if w else None for w in where]
                got = _as_tuple(jvp(tuple(full), tuple(rebuild(ins)), tuple(outs), **attrs))
                if len(got) != n_out[0]:
                    raise OnnxGradError(f"{name}: the JVP returned {len(got)} tangents for {n_out[0]} outputs")
                return got

            @staticmethod
            def backward(ctx, *grads):
                saved = ctx.saved_tensors
                ins, outs = saved[:ctx.n_in], saved[ctx.n_in:]
                full = vjp(tuple(grads), tuple(rebuild(ins)), tuple(outs), **attrs)
                full = _as_tuple(full)
                if len(full) != len(inputs):
                    raise OnnxGradError(f"{name}: the VJP returned {len(full)} gradients for {len(inputs)} inputs")
                return tuple(g for g, w in zip(full, where) if w)

        Function.__name__ = f"{name}Backward"
        out = Function.apply(*tensors)
        return out if multi[0] else out[0]

    functools.update_wrapper(apply, forward)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):  # a builtin such as torch.tanh: inputs only, no attributes
        signature = inspect.Signature([inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL)])
    apply.__signature__ = signature  # the registry reads the accepted attributes from it
    return apply


def register_op_with_vjp(op_type: str, forward: Callable, vjp: Callable, domain: str = "", since: int = 1,
                         until: int | None = None, note: str = "custom op with a hand-written VJP",
                         jvp: Callable | None = None) -> CustomOp:
    """Register `forward` for op_type with `vjp` as its backward (and `jvp` as its forward-mode rule,
    optional); returns a handle to unregister it."""
    if not callable(forward) or not callable(vjp) or (jvp is not None and not callable(jvp)):
        raise OnnxGradError("register_op_with_vjp needs a callable forward and a callable vjp (and jvp, if given)")
    dom = _norm(domain)
    key = (dom, op_type, since)
    if key in _ACTIVE:
        _ACTIVE[key].unregister()
    fn = make_function(forward, vjp, name=op_type, jvp=jvp)
    impl = OpImpl(dom, op_type, since, until, fn, note)
    previous = tuple(e for e in registry.supported_ops() if e.domain == dom and e.op_type == op_type
                     and _overlap(e, impl))
    registry.add(impl, replace=True)
    handle = CustomOp(dom, op_type, since, impl, previous)
    _ACTIVE[key] = handle
    return handle


def unregister_op(op_type: str, domain: str = "", since: int = 1) -> None:
    """Remove a custom registration and restore what it replaced."""
    dom = _norm(domain)
    handle = _ACTIVE.pop((dom, op_type, since), None)
    if handle is None:
        raise OnnxGradError(f"no custom op {op_type!r} (domain {dom or 'ai.onnx'!r}, since {since}) is registered")
    registry.remove(dom, op_type, since)
    for impl in handle.replaced:
        registry.add(impl, replace=True)


def custom_ops() -> tuple[CustomOp, ...]:
    return tuple(_ACTIVE.values())


def _overlap(a: OpImpl, b: OpImpl) -> bool:
    a_hi = a.until if a.until is not None else 10**9
    b_hi = b.until if b.until is not None else 10**9
    return a.since <= b_hi and b.since <= a_hi
