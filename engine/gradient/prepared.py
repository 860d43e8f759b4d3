"""Reverse-mode gradients of a validated selection, through torch.autograd: the one gradient call
that `Model.gradient`, the backward graph's statistics, the explorer's step mode and GradManager
build on, so what they check of xs, y and dy is checked here only (`leaf`, `float_y`, `seed_for`).

Convention for a non-scalar y: the seed is `dy` when given, otherwise ones shaped like y, so the
result is the gradient of sum(y). Members of xs that y does not reach get zeros and are flagged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.overrides import has_torch_function

from ..errors import ExecutionError, FeedError, MemoryLimitError, SelectionError
from ..run.plan import Plan, Step, StepObserver
from ..run.step_errors import out_of_memory
from .selection import GradientSpec

__all__ = ["ForwardPass", "GradientObserver", "GradientOutput", "GradientResult", "PreparedGradient", "Step",
           "StepObserver", "float_y", "leaf", "seed_for"]

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


class ForwardPass(NamedTuple):
    """`PreparedGradient.forward`'s result, what its `backward` takes."""

    y: torch.Tensor  # on autograd's tape (unless an observer detached it)
    leaves: tuple[torch.Tensor, ...]  # the values of xs as autograd leaves, in order


class GradientObserver(StepObserver):
    """A StepObserver for `PreparedGradient.forward` (every node's inputs and outputs, in order) that
    `PreparedGradient.backward` also tells the seed it starts from."""

    def seed(self, name: str, value: torch.Tensor) -> None:
        """The seed of y `name`: dy, or ones shaped like y."""


# --- the checks every gradient front end makes, in one place ------------------------------------
def leaf(name: str, value: torch.Tensor, role: str = "be in xs") -> torch.Tensor:
    """`value` as a tensor autograd differentiates with respect to; SelectionError unless it is float."""
    if not value.is_floating_point():
        kind = str(value.dtype).removeprefix("torch.")
        raise SelectionError(f"{name!r} holds {kind} values: only float tensors can {role}")
    return value if value.requires_grad else value.detach().requires_grad_()


def backward_error(y: str, exc: BaseException) -> ExecutionError:
    """One line for what torch's backward raised: a derivative torch has no kernel for (a Pow whose exponent
    is bool runs forward, but its derivative subtracts from it), or an allocation that failed. Torch does not
    say which node's derivative it was."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    memory = out_of_memory(exc, msg)
    if memory is not None:
        return MemoryLimitError(f"the backward pass from y {y!r} ran out of memory{memory}")
    return ExecutionError(f"the backward pass from y {y!r} failed in torch: {msg or type(exc).__name__}")


def float_y(y: torch.Tensor, label: str) -> None:
    """SelectionError when y (`label`: its quoted name, or "tensor") is not float."""
    if not y.is_floating_point():
        raise SelectionError(f"y {label} is {str(y.dtype).removeprefix('torch.')}: gradients need a float y")


def seed_for(y: torch.Tensor, dy=None, name: str | None = None) -> torch.Tensor:
    """The seed a backward from y starts from: `dy` (a tensor or anything numpy takes; FeedError
    unless shaped like y) as y's dtype on y's device, else ones like y. `name`: y's, for the message."""
    if dy is None:
        return torch.ones_like(y)
    if not isinstance(dy, torch.Tensor):
        dy = torch.as_tensor(np.asarray(dy))
    if tuple(dy.shape) != tuple(y.shape):
        who = "its y" if name is None else f"y {name!r}"
        raise FeedError(f"dy has shape {tuple(dy.shape)} but {who} has shape {tuple(y.shape)}")
    return dy.to(device=y.device, dtype=y.dtype)


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
    """dy/dx for one selection, compiled once; call with torch tensors for xs then zs (then extras).

    `prepared(*values, dy=)` is the gradient in one call; `forward` then `backward` are the same
    call in two halves, the forward pass walked node by node through an observer (step mode, the
    backward graph's statistics); `seed` is the seed a backward starts from; `nodes` the graph
    nodes the forward pass runs, in order."""

    def __init__(self, spec: GradientSpec, plan: Plan):
        self.spec = spec
        self.plan = plan
        self.device = plan.device
        self.float_dtype = plan.float_dtype
        self.extra_inputs = plan.sources[len(spec.inputs):]

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.plan.sources

    @property
    def nodes(self) -> tuple[int, ...]:
        """Indices in `graph.nodes` of the nodes the forward pass runs, in the order it runs them."""
        return self.plan.node_indices

    def __call__(self, *values: torch.Tensor, dy: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None,
                 create_graph: bool = False) -> GradientOutput:
        if not torch.is_grad_enabled():  # entering enable_grad costs a few Python calls: only when needed
            with torch.enable_grad():
                return self(*values, dy=dy, create_graph=create_graph)
        n = len(self.spec.xs)
        leaves = [leaf(name, v) for name, v in zip(self.spec.xs, values[:n])]
        (y,) = self.plan.run(leaves + list(values[n:]), fused=not create_graph)
        return self._backward(y, leaves, dy, create_graph, None)

    def forward(self, *values: torch.Tensor, observer: StepObserver | None = None) -> ForwardPass:
        """The forward half of a call: xs become leaves (checked as the call checks them), then the
        nodes run one by one, `observer` seeing and able to replace every value (StepObserver):
        `source(name, value)` for each input, `arguments(step, names, args)` before and
        `outputs(step, args, names, outs)` after each node (`step.node_index`, `.name`, `.op_type`)."""
        with torch.enable_grad():
            n = len(self.spec.xs)
            leaves = [leaf(name, v) for name, v in zip(self.spec.xs, values[:n])]
            rest = leaves + list(values[n:])
            (y,) = self.plan.run(rest) if observer is None else self.plan.run_observed(rest, observer)
        return ForwardPass(y, tuple(leaves))

    def backward(self, forward: ForwardPass, dy=None, observer: StepObserver | None = None) -> GradientOutput:
        """The backward half: the gradients of `forward.y` seeded with `dy` (else ones), as a call
        returns them; an observer with a `seed(name, value)` method (GradientObserver) sees the seed."""
        with torch.enable_grad():
            return self._backward(forward.y, list(forward.leaves), dy, False, observer)

    def seed(self, y: torch.Tensor, dy=None) -> torch.Tensor:
        """The seed a backward from this y starts from: dy checked and converted (`seed_for`), else ones."""
        return seed_for(y, dy, self.spec.y)

    def _backward(self, y, leaves, dy, create_graph: bool, observer) -> GradientOutput:
        spec = self.spec
        if not isinstance(y, torch.Tensor):  # declared a tensor, computed a sequence (or nothing): no seed fits it
            kind = "a sequence" if isinstance(y, (list, tuple)) else "empty" if y is None else f"a {type(y).__name__}"
            raise SelectionError(f"y {spec.y!r} is {kind}, not a tensor: gradients need a tensor y")
        if callable(dy):  # a seed made from y itself (the verifier's random dy needs y's shape)
            dy = dy(y.detach())
        if dy is not None:
            dy = seed_for(y, dy, spec.y)
        wanted = [i for i, name in enumerate(spec.xs) if name not in spec.disconnected]
        raw: Sequence[torch.Tensor | None] = [None] * len(wanted)
        seed = dy
        if wanted and y.requires_grad:
            float_y(y, repr(spec.y))
            # A one-element y's seed of ones is autograd's own default (no tensor to build and check).
            if seed is None and (observer is not None or y.numel() != 1):
                seed = seed_for(y)
            try:
                raw = vjp(y, [leaves[i] for i in wanted], seed, create_graph=create_graph)
            except (RuntimeError, MemoryError) as exc:
                raise backward_error(spec.y, exc) from None
        if seed is not None and observer is not None and hasattr(observer, "seed"):
            observer.seed(spec.y, seed)
        grads, disconnected = complete_gradients(spec, leaves, wanted, raw)
        return GradientOutput(y if create_graph else y.detach(), grads, disconnected)

    def node_step(self):
        """The step function that executes an ai.onnx.preview.training::Gradient node."""

        def gradient_node(*values):
            nested = torch.is_grad_enabled() and any(v is not None and v.requires_grad for v in values)
            return self(*values, create_graph=nested).grads

        gradient_node.no_fold = True  # a nested gradient: always computed in the run
        return gradient_node
