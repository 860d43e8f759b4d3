"""J·v of one node through its VJP, for the ops torch's forward AD does not cover (GridSample,
DeformConv, Scatter with reduction 'mul'): exact, no finite differences.

The node runs on its inputs' primal values; its tangent is J·v assembled from reverse mode, one row
of J per output element: the VJP of every unit cotangent at once (`is_grads_batched`, a loop where
the backward has no batching rule), each row dotted with v. That costs one VJP per output element,
so it is taken only for a node whose outputs times inputs stay under `LIMIT_ELEMENTS`; a bigger one
is refused, named, as before. `PreparedJVP` switches a node to this path when the node first refuses.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from ..errors import ForwardModeError
from ..run.plan import StepObserver
from .rules import tangent_of

LIMIT_ELEMENTS = 1 << 24  # output elements × differentiated input elements of one node


class ByVJP(StepObserver):
    """Runs the nodes in `nodes` on primal values and gives their outputs tangents from their VJPs;
    `then` (a TangentWatch, or None) sees every step after."""

    def __init__(self, nodes: set[int], then: StepObserver | None = None):
        self.nodes, self.then = nodes, then
        self.tangents: list = []

    def source(self, name, value):
        return value

    def arguments(self, step, names, args):
        if step.node_index not in self.nodes:
            return args
        self.tangents = [tangent_of(a) for a in args]
        return [a if t is None else fwAD.unpack_dual(a).primal for a, t in zip(args, self.tangents)]

    def outputs(self, step, args, names, outs):
        if step.node_index in self.nodes:
            outs = through_vjp(step, args, self.tangents, outs)
        return outs if self.then is None else self.then.outputs(step, args, names, outs)


def through_vjp(step, args, tangents, outs) -> list:
    wrt = [(k, t) for k, t in enumerate(tangents) if t is not None]
    if not wrt:
        return outs
    leaves = [a.detach().requires_grad_() if t is not None else a for a, t in zip(args, tangents)]
    with torch.enable_grad():
        again = step.fn(*leaves, **step.kwargs)
    again = list(again) if isinstance(again, (tuple, list)) else [again]
    inputs = [leaves[k] for k, _ in wrt]
    size = sum(leaves[k].numel() for k, _ in wrt)
    made = []
    for o, fresh in zip(outs, again):
        if not (isinstance(fresh, torch.Tensor) and fresh.is_floating_point()):
            made.append(o)
            continue
        if not fresh.requires_grad:  # rebuilt outside autograd: reverse mode cannot see through it either
            raise ForwardModeError(f"node {step.name!r} ({step.op_type}) has no forward-mode rule (JVP): it reads a "
                                   "tangent and gives none back, even through autograd, so J·v would be silently "
                                   "zero along it", step.node_index)
        n = fresh.numel()
        if n * size > LIMIT_ELEMENTS:
            raise ForwardModeError(f"node {step.name!r} ({step.op_type}) has no forward-mode rule (JVP), and J·v "
                                   f"through its VJP would take {n} of them ({n} output elements × {size} input "
                                   "elements is over the limit)", step.node_index)
        rows = _rows(fresh, inputs)
        tangent = sum(r.reshape(n, -1) @ t.reshape(-1).to(r.dtype) for r, (_, t) in zip(rows, wrt) if r is not None)
        made.append(o if isinstance(tangent, int) else fwAD.make_dual(o, tangent.reshape(o.shape).to(o.dtype)))
    return made


def _rows(out: torch.Tensor, inputs: list) -> list:
    """Jᵀe_i for every output element i, per input: the rows of the node's Jacobian."""
    n = out.numel()
    basis = torch.eye(n, dtype=out.dtype, device=out.device).reshape(n, *out.shape)
    try:
        return list(torch.autograd.grad(out, inputs, basis, retain_graph=True, allow_unused=True,
                                        is_grads_batched=True))
    except RuntimeError:  # the backward has no batching rule: one VJP at a time
        per = [torch.autograd.grad(out, inputs, e, retain_graph=True, allow_unused=True) for e in basis]
        return [None if per[0][j] is None else torch.stack([p[j] for p in per]) for j in range(len(inputs))]
