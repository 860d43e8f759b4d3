"""Wrong VJPs injected on purpose, to test the verifier itself: a check that passes one has failed.

A mutant is (op type, kind, input): every node of that op type gets a backward computed as the
right VJP (torch.autograd through the registered forward) and then spoiled the way real backward
passes go wrong:

    drop_factor   the local derivative left out: the upstream gradient passed straight through
                  (one float input), or the other operands taken as ones (several: Mul, MatMul, Conv)
    sign          the gradient negated
    scale_1.05    scaled by 1.05 (and scale_1.1 by 1.1): a constant factor off
    permute       two axes transposed and reshaped back (a layout mix-up), or one axis reversed
    broadcast     a broadcast input's gradient averaged instead of summed over the broadcast axes
    zero_part     the second half of the elements left at zero (a loop that stops early)
    swap          the gradients of two same-shaped inputs exchanged

The forward is untouched, so finite differences see the model as it is; only the VJP lies.
`injected(mutant)` swaps the registry's functions for the op type (every opset) and puts them
back; load the model inside it, since a loaded Model has bound its ops.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Iterator

import torch

from .. import registry
from ..verify.custom import make_function

KINDS = ("drop_factor", "sign", "scale_1.05", "scale_1.1", "permute", "broadcast", "zero_part", "swap")


@dataclass(frozen=True)
class Mutant:
    op_type: str
    kind: str
    input: int  # the input whose gradient is spoiled (swap: the first of the two)
    domain: str = ""

    @property
    def label(self) -> str:
        where = f"{self.domain}::" if self.domain else ""
        return f"{where}{self.op_type}/{self.kind}/in{self.input}"


def spoil(kind: str, index: int, true: list, grads: tuple, inputs: tuple, fn, attrs: dict) -> list:
    """The true per-input VJPs `true` spoiled by `kind` at input `index` (unchanged where it does not apply)."""
    out = list(true)
    g = out[index] if index < len(out) else None
    if g is None:
        return out
    if kind == "sign":
        out[index] = -g
    elif kind.startswith("scale_"):
        out[index] = g * float(kind.removeprefix("scale_"))
    elif kind == "permute":
        out[index] = _permuted(g)
    elif kind == "zero_part":
        flat = g.reshape(-1).clone()
        flat[(flat.numel() + 1) // 2:] = 0
        out[index] = flat.reshape(g.shape)
    elif kind == "broadcast":
        first = grads[0] if grads and grads[0] is not None else None
        if first is not None and 0 < g.numel() < first.numel():
            out[index] = g * (g.numel() / first.numel())
    elif kind == "swap":
        partner = next((j for j in range(index + 1, len(out)) if out[j] is not None and out[j].shape == g.shape), None)
        if partner is not None:
            out[index], out[partner] = out[partner], g
    elif kind == "drop_factor":
        out[index] = _dropped(index, true, grads, inputs, fn, attrs, g)
    return out


def _permuted(g: torch.Tensor) -> torch.Tensor:
    axes = [a for a in range(g.dim()) if g.shape[a] > 1]
    if len(axes) >= 2:
        return g.transpose(axes[-2], axes[-1]).contiguous().reshape(g.shape)
    if axes:
        return g.flip(axes[0])
    return g


def _dropped(index, true, grads, inputs, fn, attrs, g):
    floats = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point() and true[k] is not None]
    first = grads[0] if grads else None
    if len(floats) == 1:
        if first is not None and first.shape == g.shape:
            return first.to(g.dtype)
        return g
    if fn is None or first is None:  # nothing to recompute the product with: not applicable
        return g
    # The other operands as ones: Mul's dy * b becomes dy, MatMul's dy @ b^T a row sum, Conv's a box sum.
    ones = [torch.ones_like(t) if k in floats and k != index else t for k, t in enumerate(inputs)]
    return _vjps(fn, ones, grads, attrs)[index]


def _vjps(fn, inputs, grads, attrs) -> list:
    """torch.autograd's VJP of `fn` at `inputs` for the output gradients `grads`, one per input."""
    floats = [k for k, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() if k in floats else t for k, t in enumerate(inputs)]
        out = fn(*leaves, **attrs)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        pairs = [(o, g) for o, g in zip(out, grads) if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], [leaves[k] for k in floats], [g for _, g in pairs],
                                    allow_unused=True) if pairs and floats else [None] * len(floats)
    full: list = [None] * len(inputs)
    for k, g in zip(floats, found):
        full[k] = g
    return full


def mutated(fn, mutant: Mutant):
    """`fn` with the mutant's VJP (a torch.autograd.Function, vmappable for the batched finite differences)."""

    def vjp(grads, inputs, outputs, **attrs):
        true = _vjps(fn, list(inputs), grads, attrs)
        return tuple(spoil(mutant.kind, mutant.input, true, grads, tuple(inputs), fn, attrs))

    spoiled = make_function(fn, vjp, name=mutant.op_type)

    # Finite differences run without autograd: there the plain forward is the same function and
    # skips the autograd.Function's generated vmap rule (milliseconds a call).
    @functools.wraps(fn)
    def step(*inputs, **attrs):
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            return spoiled(*inputs, **attrs)
        return fn(*inputs, **attrs)

    step.__signature__ = spoiled.__signature__
    return step


@contextlib.contextmanager
def injected(mutant: Mutant) -> Iterator[None]:
    """Every registration of the mutant's op type (all opsets) has the mutant's VJP inside the block."""
    originals = [e for e in registry.supported_ops() if e.op_type == mutant.op_type and e.domain == mutant.domain]
    if not originals:
        raise KeyError(f"no op {mutant.label.split('/')[0]} is registered")
    try:
        for impl in originals:
            registry.add(registry.OpImpl(impl.domain, impl.op_type, impl.since, impl.until, mutated(impl.fn, mutant),
                                         f"mutant {mutant.kind}"), replace=True)
        yield
    finally:
        for impl in originals:
            registry.add(impl, replace=True)


def candidates(ctx) -> list[Mutant]:
    """Every mutant of the op types on the y <- xs path of a check's context (verify/context.py), for
    each input through which the gradient flows at some node of that type."""
    from ..verify.pernode import path_steps

    live: dict[tuple[str, str], set[int]] = {}
    for step, _, inputs in path_steps(ctx):
        node = ctx.model.graph.nodes[step.node_index]
        key = (node.domain if node.domain not in ("", "ai.onnx") else "", step.op_type)
        live.setdefault(key, set()).update(inputs)
    return [Mutant(op_type, kind, index, domain)
            for (domain, op_type), indices in sorted(live.items()) if domain != "ai.onnx.preview.training"
            for kind in KINDS for index in sorted(indices)]
