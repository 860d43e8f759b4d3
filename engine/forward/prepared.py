"""Forward-mode derivatives of a validated selection: J·v (`PreparedJVP`) and, for a scalar y, H·v by
forward over reverse (`PreparedHVP`), on the same plan `prepare_gradient` runs.

The values of xs become torch forward-AD dual tensors carrying their tangents; the plan runs as it
runs for a gradient, so every op's JVP is torch's own forward rule (a custom op's registered `jvp`).
H·v is the tangent of autograd's gradient taken with `create_graph` inside the same dual level: the
gradient's own backward formulas are differentiated forward along v, as `torch.func.jvp(grad(f))`.

The first call walks the steps one by one under `TangentWatch` (rules.py), which names a node that
drops a tangent; later calls take the plan's compiled run. Attention runs on torch's math kernel,
which has forward rules (the CPU flash kernel has none), whether it is a fused step or an ONNX
Attention op; a fused step whose kernel still has none replays the ops it stands for, as for any
case its kernel declines (engine/run/fusion.py): never a refusal.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import ExecutionError, ForwardModeError, SelectionError
from ..gradient import prepared as checks  # the gradient call's checks, looked up when called (one place)
from ..gradient.prepared import vjp
from ..gradient.selection import GradientSpec
from ..run.plan import Plan, StepObserver
from .by_vjp import ByVJP
from .rules import TangentWatch, refusal, tangent_of


class JVPOutput(NamedTuple):
    y: torch.Tensor
    jvp: torch.Tensor  # J·v, shaped like y
    disconnected: frozenset[str]


class HVPOutput(NamedTuple):
    y: torch.Tensor
    grads: tuple[torch.Tensor, ...]  # dy/dx, one per x
    hvp: tuple[torch.Tensor, ...]  # H·v, one block per x
    disconnected: frozenset[str]


class _Chain(StepObserver):
    """A caller's observer after a TangentWatch (either may be None)."""

    def __init__(self, observer: StepObserver | None, watch: StepObserver | None):
        self.observer, self.watch = observer, watch

    def source(self, name, value):
        return value if self.observer is None else self.observer.source(name, value)

    def arguments(self, step, names, args):
        return args if self.observer is None else self.observer.arguments(step, names, args)

    def outputs(self, step, args, names, outs):
        if self.watch is not None:
            outs = self.watch.outputs(step, args, names, outs)
        return outs if self.observer is None else self.observer.outputs(step, args, names, outs)


class _ForwardMode:
    """What J·v and H·v share: the plan, the x values as duals, the first call's watch, the fallback."""

    def __init__(self, spec: GradientSpec, plan: Plan):
        self.spec, self.plan = spec, plan
        self.device, self.float_dtype = plan.device, plan.float_dtype
        self.extra_inputs = plan.sources[len(spec.inputs):]
        self.watched = False  # the first call walks the steps under TangentWatch
        self.through_vjp: set[int] = set()  # nodes whose J·v comes from their VJP (by_vjp.py)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.plan.sources

    def run(self, inputs: list, fused: bool = True, observer: StepObserver | None = None,
            by_vjp: bool = True) -> torch.Tensor:
        """y with its tangent. A node that refuses forward mode (no rule, or a dropped tangent) is
        taken through its VJP from then on (`by_vjp.py`) when `by_vjp`; else the refusal stands."""
        while True:
            try:
                with sdpa_kernel(SDPBackend.MATH):
                    return self._run(inputs, fused, observer)
            except (ExecutionError, ForwardModeError) as exc:
                refused = exc if isinstance(exc, ForwardModeError) else refusal(exc)
                if refused is None:
                    raise
            index = refused.node_index if by_vjp and not refused.custom else None
            if index is None or index in self.through_vjp:
                raise refused from None
            self.through_vjp.add(index)

    def _run(self, inputs: list, fused: bool, observer: StepObserver | None) -> torch.Tensor:
        if observer is None and self.watched and not self.through_vjp:
            return self.plan.run(inputs, fused=fused)[0]
        watch = TangentWatch(self.plan.graph) if observer is not None or not self.watched else None
        chain: StepObserver = _Chain(observer, watch)
        if self.through_vjp:
            chain = ByVJP(self.through_vjp, chain)
        (y,) = self.plan.run_observed(inputs, chain, free=True)
        self.watched = True
        return y

    def tangents(self, leaves: Sequence[torch.Tensor], tangents: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for name, x, v in zip(self.spec.xs, leaves, tangents):
            if tuple(v.shape) != tuple(x.shape):
                raise SelectionError(f"the tangent of {name!r} has shape {tuple(v.shape)}, but {name!r} has shape "
                                     f"{tuple(x.shape)}")
            out.append(fwAD.make_dual(x, v.to(device=x.device, dtype=x.dtype)))
        return out


class PreparedJVP(_ForwardMode):
    """J·v for one selection, compiled once: `prepared(*values, tangents=[v per x])` with the values
    of xs, zs then extras as torch tensors (the order of `input_names`), as PreparedGradient takes them."""

    def __call__(self, *values: torch.Tensor, tangents: Sequence[torch.Tensor],
                 observer: StepObserver | None = None) -> JVPOutput:
        """J·v; with `observer`, the nodes run one by one and it sees every value as a forward-AD
        dual tensor (`tangent_of(value)` is its tangent, None where it carries none): the explorer's
        forward-mode steps. An observer's run is also watched (TangentWatch), as a first call is."""
        spec, n = self.spec, len(self.spec.xs)
        if len(tangents) != n:
            raise SelectionError(f"{len(tangents)} tangent(s) for {n} x(s)")
        xs = [checks.leaf(name, v).detach() for name, v in zip(spec.xs, values[:n])]
        with torch.no_grad(), fwAD.dual_level():
            inputs = self.tangents(xs, tangents) + list(values[n:])
            y = self.run(inputs, observer=observer)
            checks.float_y(y, repr(spec.y))
            t = tangent_of(y)
            y = fwAD.unpack_dual(y).primal
        if t is None:  # TangentWatch passed, so no step dropped one: y does not move along any x
            t = torch.zeros_like(y)
        return JVPOutput(y, t, frozenset(spec.disconnected))


class PreparedHVP(_ForwardMode):
    """H·v of a scalar y, compiled once: `prepared(*values, vs=[v per x])` -> dy/dx and H·v per x.
    With `dy` (shaped like y), of the scalar <dy, y> instead, for any y (the verifier's second order)."""

    def __call__(self, *values: torch.Tensor, vs: Sequence[torch.Tensor], dy: torch.Tensor | None = None
                 ) -> HVPOutput:
        spec, n = self.spec, len(self.spec.xs)
        if len(vs) != n:
            raise SelectionError(f"{len(vs)} direction(s) for {n} x(s)")
        leaves = [checks.leaf(name, v.detach()) for name, v in zip(spec.xs, values[:n])]
        wanted = [i for i, name in enumerate(spec.xs) if name not in spec.disconnected]
        with torch.enable_grad(), fwAD.dual_level():
            duals = self.tangents(leaves, vs)
            # unfused: the gradient is differentiated again, which a fused kernel's backward is not
            y = self.run(duals + list(values[n:]), fused=False, by_vjp=False)
            checks.float_y(y, repr(spec.y))
            if y.numel() != 1 and dy is None:
                raise SelectionError(f"H·v needs a scalar y: {spec.y!r} has shape {tuple(y.shape)}")
            seed = None if dy is None else checks.seed_for(y, dy, spec.y)
            raw = vjp(y, [duals[i] for i in wanted], seed, create_graph=True) if wanted and y.requires_grad \
                else [None] * len(wanted)
            grads: list = [None] * n
            hvp: list = [None] * n
            disconnected = set(spec.disconnected)
            for i, g in zip(wanted, raw):
                if g is None:
                    disconnected.add(spec.xs[i])
                    continue
                primal, tangent = fwAD.unpack_dual(g)
                grads[i] = primal.detach()
                hvp[i] = None if tangent is None else tangent.detach()
            y = fwAD.unpack_dual(y).primal.detach()
        grads = [torch.zeros_like(leaves[i]) if g is None else g for i, g in enumerate(grads)]
        # A gradient with no tangent does not move along v: that block of H·v is zero (y linear there).
        hvp = [torch.zeros_like(leaves[i]).detach() if h is None else h for i, h in enumerate(hvp)]
        return HVPOutput(y, tuple(grads), tuple(hvp), frozenset(disconnected))

