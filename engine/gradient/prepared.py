"""Reverse-mode gradients of a validated selection, through torch.autograd.

Convention for a non-scalar y: the seed is `dy` when given, otherwise ones shaped like y, so the
result is the gradient of sum(y). Members of xs that y does not reach get zeros and are flagged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.overrides import has_torch_function

from ..errors import FeedError, SelectionError
from ..run.plan import Plan
from .selection import GradientSpec

# torch.autograd.grad's own engine call (see `vjp`); None if a torch release renames it.
_run_backward = getattr(torch.autograd.graph, "_engine_run_backward", None)


class GradientOutput(NamedTuple):
    y: torch.Tensor
    grads: tuple[torch.Tensor, ...]  # one per xs member, same order
    disconnected: frozenset[str]


@dataclass(frozen=True)
class GradientResult:
    """What `Model.gradient` returns: numpy arrays keyed by tensor name."""

    spec: GradientSpec
    y: np.ndarray
    grads: dict[str, np.ndarray]
    disconnected: frozenset[str]
    seed: str  # "dy" or "ones"
    device: str = "cpu"
    dtype: str = "native"
    # The values used for xs ∪ zs, read-only. A numpy feed of exactly the declared type was used in
    # place: its entry is a view of the caller's array, so writing to that array later shows here.
    values: dict[str, np.ndarray] = field(default_factory=dict)


def vjp(y: torch.Tensor, inputs: Sequence[torch.Tensor], seed: torch.Tensor | None,
        create_graph: bool = False) -> tuple[torch.Tensor | None, ...]:
    """`torch.autograd.grad(y, inputs, seed, allow_unused=True, create_graph=create_graph)` for a
    seed already of y's shape, dtype and device. Given a seed tensor, `torch.autograd.grad` checks
    its shape through torch.fx.experimental.symbolic_shapes, whose first import brings in sympy:
    about 480 modules, 34 MB of RSS and a few tenths of a second, more than resnet50's whole
    backward holds (docs/benchmarks.md, "Pretrained-size models"). The engine call below is what
    `torch.autograd.grad` makes after that check, so the gradients are the same tensors."""
    if seed is None or _run_backward is None or has_torch_function((y, *inputs)):
        return torch.autograd.grad(y, inputs, seed, allow_unused=True, create_graph=create_graph)
    return _run_backward((y,), (seed,), create_graph, create_graph, tuple(inputs), True, accumulate_grad=False)


def complete_gradients(spec: GradientSpec, leaves: Sequence[torch.Tensor], wanted: Sequence[int],
                       raw: Sequence[torch.Tensor | None]) -> tuple[tuple[torch.Tensor, ...], frozenset[str]]:
    """One gradient per x (autograd's for the `wanted` ones), zeros where none flowed, and the
    disconnected names: y does not reach them, or reaches them only through ops without a
    gradient (Shape, ArgMax, Cast to int...)."""
    grads: list[torch.Tensor | None] = [None] * len(spec.xs)
    for i, g in zip(wanted, raw):
        grads[i] = g
    disconnected = set(spec.disconnected)
    for i, g in enumerate(grads):
        if g is None:
            disconnected.add(spec.xs[i])
            grads[i] = torch.zeros_like(leaves[i])
    return tuple(grads), frozenset(disconnected)


class PreparedGradient:
    """dy/dx for one selection, compiled once; call with torch tensors for xs then zs (then extras)."""

    def __init__(self, spec: GradientSpec, plan: Plan):
        self.spec = spec
        self.plan = plan
        self.device = plan.device
        self.float_dtype = plan.float_dtype
        self.extra_inputs = plan.sources[len(spec.inputs):]

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.plan.sources

    def __call__(self, *values: torch.Tensor, dy: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None,
                 create_graph: bool = False) -> GradientOutput:
        if not torch.is_grad_enabled():  # entering enable_grad costs a few Python calls: only when needed
            with torch.enable_grad():
                return self(*values, dy=dy, create_graph=create_graph)
        spec = self.spec
        n = len(spec.xs)
        leaves = []
        for name, v in zip(spec.xs, values[:n]):
            if not v.is_floating_point():
                kind = str(v.dtype).removeprefix('torch.')
                raise SelectionError(f"{name!r} holds {kind} values: only float tensors can be in xs")
            leaves.append(v if v.requires_grad else v.detach().requires_grad_())
        (y,) = self.plan.run(leaves + list(values[n:]), fused=not create_graph)
        if callable(dy):  # a seed made from y itself (the verifier's random dy needs y's shape)
            dy = dy(y.detach())
        if dy is not None and tuple(dy.shape) != tuple(y.shape):
            raise FeedError(f"dy has shape {tuple(dy.shape)} but y {spec.y!r} has shape {tuple(y.shape)}")
        wanted = [i for i, name in enumerate(spec.xs) if name not in spec.disconnected]
        raw: Sequence[torch.Tensor | None] = [None] * len(wanted)
        if wanted and y.requires_grad:
            if not y.is_floating_point():
                raise SelectionError(f"y {spec.y!r} is {str(y.dtype).removeprefix('torch.')}: gradients need a float y")
            # A one-element y's seed of ones is autograd's own default (no tensor to build and check).
            seed = (None if y.numel() == 1 else torch.ones_like(y)) if dy is None else \
                dy.to(device=y.device, dtype=y.dtype)
            raw = vjp(y, [leaves[i] for i in wanted], seed, create_graph=create_graph)
        grads, disconnected = complete_gradients(spec, leaves, wanted, raw)
        return GradientOutput(y if create_graph else y.detach(), grads, disconnected)

    def node_step(self):
        """The step function that executes an ai.onnx.preview.training::Gradient node."""

        def gradient_node(*values):
            nested = torch.is_grad_enabled() and any(v is not None and v.requires_grad for v in values)
            return self(*values, create_graph=nested).grads

        gradient_node.no_fold = True  # a nested gradient: always computed in the run
        return gradient_node
