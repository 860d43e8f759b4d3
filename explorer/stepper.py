"""Step mode's trace: the forward pass, then reverse mode node by node. No Textual here.

Built on the engine's stepping API (docs/python-api.md): the call `Model.gradient` makes
(`Model.gradient_call`) gives the inputs, its prepared gradient's `forward` walks the nodes with an
observer, `seed` starts the reverse pass and `nodes` lists what ran. The reverse pass is done here
one node at a time (each node's VJP through torch autograd on the
values it saw), not by one autograd call, so every frame can show what arrived, what the local
rule sent to each input and how fan-out gradients add up. The sum it ends with is checked in the
tests against `Model.gradient`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping

import numpy as np
import torch

import engine

from .rules import rule_lines
from .summaries import array_stats


@dataclass(frozen=True)
class TensorView:
    """A tensor as step mode prints it: name, shape, a few stats and a short preview."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    norm: float | None
    min: float | None
    max: float | None
    preview: str

    @classmethod
    def of(cls, name: str, value) -> "TensorView":
        a = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        s = array_stats(a)
        flat = a.reshape(-1)[:3]
        preview = "[" + ", ".join(f"{v:.4g}" if a.dtype.kind in "fc" else str(v) for v in flat)
        preview += ", …]" if a.size > 3 else "]"
        return cls(name, tuple(a.shape), s["dtype"], s.get("norm"), s.get("min"), s.get("max"), preview)


@dataclass(frozen=True)
class Outgoing:
    """What one input of a node receives in the reverse pass."""

    symbol: str
    tensor: str
    rule: str | None
    contribution: torch.Tensor | None  # None: no gradient flows to this input
    note: str  # accumulation at fan-out, or why nothing flows


@dataclass(frozen=True)
class Frame:
    """One step. Tensors are kept as they are; TensorView.of summarises them when shown, so
    tracing a 1,700-node model does not pay for statistics nobody looks at."""

    phase: str  # "forward" or "reverse"
    node_index: int
    node_name: str
    op_type: str
    inputs: tuple[str, ...]  # names, looked up in Trace.values
    outputs: tuple[str, ...]
    incoming: tuple[tuple[str, torch.Tensor], ...] = ()  # reverse: gradient arriving at each output
    outgoing: tuple[Outgoing, ...] = ()
    # forward: forward mode's tangents (along v) at the inputs that carry one, and at the outputs
    tangents_in: tuple[tuple[str, torch.Tensor], ...] = ()
    tangents_out: tuple[tuple[str, torch.Tensor], ...] = ()


@dataclass(frozen=True)
class Trace:
    """The frames traced so far. Step mode opens on the forward frames; the reverse frames follow
    in chunks (`extended`), and `grads` is set once the reverse pass is complete."""

    spec: engine.GradientSpec
    frames: tuple[Frame, ...]
    values: dict[str, torch.Tensor]  # every forward value the frames name
    forward_count: int
    grads: dict[str, np.ndarray] | None = None  # the accumulated gradient of every x, after the last frame
    forward_mode: "ForwardMode | None" = None  # J·v along v, beside the forward frames

    @property
    def complete(self) -> bool:
        return self.grads is not None

    def extended(self, frames: tuple[Frame, ...], grads: dict[str, np.ndarray] | None = None) -> "Trace":
        return replace(self, frames=self.frames + tuple(frames), grads=grads)

    def view(self, name: str) -> TensorView:
        return TensorView.of(name, self.values[name])


@dataclass(frozen=True)
class ForwardMode:
    """Forward mode beside the forward pass: the tangent v of xs (random, seeded as `onnxgrad jvp`'s),
    J·v at y, or why forward mode could not go through (an op without a forward rule)."""

    v: dict[str, torch.Tensor]
    jvp: torch.Tensor | None
    failure: str | None = None

    def identity(self, grads: Mapping[str, np.ndarray]) -> tuple[float, float] | None:
        """The transpose identity with the reverse pass's seed of ones: (⟨1, J·v⟩, Σₓ ⟨dy/dx, v⟩)."""
        if self.jvp is None:
            return None
        left = float(self.jvp.double().sum())
        right = sum(float((torch.from_numpy(np.asarray(grads[x])).double() * self.v[x].double().cpu()).sum())
                    for x in self.v)
        return left, right


def trace(model: engine.Model, spec: engine.GradientSpec, feeds: Mapping[str, np.ndarray], *,
          device: str = "cpu", dtype: str | None = None, seed: int = 0,
          should_stop: Callable[[], bool] | None = None,
          progress: Callable[[int, int], None] | None = None) -> Trace:
    """The whole trace in one call: every forward frame, then every reverse frame."""
    tracer = Tracer(model, spec, feeds, device=device, dtype=dtype, seed=seed)
    frames = []

    def emit(frame: Frame) -> None:
        frames.append(frame)
        if progress is not None and frame.phase == "reverse" and len(frames) % 25 == 0:
            progress(tracer.done, tracer.total)

    tracer.run(emit, should_stop)
    return tracer.head.extended(tuple(frames), tracer.grads)


class _Stopped(Exception):
    """Raised out of the forward run when the caller stops tracing (not a step error: it passes through)."""


class Tracer:
    """The frames of one selection, one at a time: `run` walks the forward pass node by node, then
    reverse mode node by node, handing each frame on as it is made; it stops between nodes.
    Building it runs nothing. `head` is the empty trace the frames extend; `done` of `total` nodes
    the reverse pass has visited; `grads` once it has visited all."""

    def __init__(self, model: engine.Model, spec: engine.GradientSpec, feeds: Mapping[str, np.ndarray], *,
                 device: str = "cpu", dtype: str | None = None, seed: int = 0):
        self.graph, self.spec, self.model = model.graph, spec, model
        # The call `Model.gradient` makes for these names (cached on the model): same inputs, same checks.
        call = model.gradient_call(spec.y, spec.xs, spec.zs, feeds, device=device, dtype=dtype)
        self.prepared = call.prepared
        self.inputs, _ = call.inputs(feeds, seed)
        self.nodes = self.prepared.nodes  # graph node indices, in the order the forward pass runs them
        self.values: dict[str, torch.Tensor] = {}  # filled as the forward pass reaches each tensor
        self.live = set(spec.xs)  # tensors that depend on some x: only they receive gradient
        self.tape: dict[int, tuple] = {}  # node index -> (leaves, outputs) on autograd's tape
        self.head = Trace(spec, (), self.values, len(self.nodes))
        self.total = len(self.nodes)
        self.done = 0
        self.grads: dict[str, np.ndarray] | None = None
        self.seed = seed
        self.tangents: dict[str, torch.Tensor] = {}  # forward mode's tangent of each tensor that has one

    def run(self, emit: Callable[[Frame], None], should_stop: Callable[[], bool] | None = None,
            forward_done: Callable[[], None] | None = None) -> None:
        """Every frame to `emit`, in order; `forward_done()` between the passes; `grads` is set when
        the last frame has been emitted."""
        stop = should_stop or (lambda: False)
        self.tangents, mode = self._forward_mode()
        self.head = replace(self.head, forward_mode=mode)
        try:
            # Node by node through the observer, not one compiled pass: each frame leaves as soon as
            # its node ran; only the nodes _Recorder gives leaves are taped.
            forward = self.prepared.forward(*self.inputs, observer=_Recorder(self, emit, stop))
        except _Stopped:
            return
        if forward_done is not None:
            forward_done()
        for frame in self._reverse(stop, self.prepared.seed(forward.y)):
            emit(frame)

    def _forward_mode(self) -> tuple[dict[str, torch.Tensor], ForwardMode]:
        """Every tangent forward mode gives along a random v (one pass, before the forward frames)."""
        from engine.forward import directions, tangent_of

        spec, n = self.spec, len(self.spec.xs)
        v = directions(spec, "random", list(self.inputs[:n]), self.seed)
        seen: dict[str, torch.Tensor] = {}

        class Keep:  # a StepObserver (docs/python-api.md) that keeps each tangent
            def source(self, name, value):
                t = tangent_of(value)
                if t is not None:
                    seen[name] = t.detach()
                return value

            def arguments(self, step, names, args):
                return args

            def outputs(self, step, args, names, outs):
                for name, o in zip(names, outs):
                    t = tangent_of(o)
                    if name is not None and t is not None:
                        seen[name] = t.detach()
                return outs

        prepared = self.model.prepare_jvp(spec.y, spec.xs, spec.zs, device=self.prepared.device,
                                          dtype=self.prepared.float_dtype, extra_inputs=self.prepared.extra_inputs)
        try:
            out = prepared(*self.inputs, tangents=v, observer=Keep())
        except engine.OnnxGradError as exc:
            return {}, ForwardMode(dict(zip(spec.xs, v)), None, str(exc))
        return seen, ForwardMode(dict(zip(spec.xs, v)), out.jvp)

    def _reverse(self, should_stop, seed: torch.Tensor) -> Iterator[Frame]:
        graph, values, live = self.graph, self.values, self.live
        opset = graph.opset("")
        in_plan = set(self.nodes)
        fan_in = {t: len({i for i in graph.consumers.get(t, ()) if i in in_plan}) for t in live}
        grads: dict[str, torch.Tensor] = {self.spec.y: seed}
        received: dict[str, int] = {}
        for index in reversed(self.nodes):
            if should_stop():
                return
            self.done += 1
            node = graph.nodes[index]
            arriving = [(t, grads[t]) for t in node.output if t in grads]
            if not arriving or not any(t in live for t in node.input):
                continue
            sent = _vjp(self.tape.pop(index, None), node, dict(arriving))
            outgoing, counted = [], set()
            for (sym, rule), t in zip(rule_lines(node, opset), list(node.input) + [""] * 8):
                if not t:
                    continue
                if t in counted:  # Mul(A, A): the VJP already summed both uses into one gradient
                    outgoing.append(Outgoing(sym, t, rule, None, f"same tensor as an earlier input: d{t} counted there"))
                    continue
                counted.add(t)
                g = sent.get(t)
                if t not in live or g is None:
                    why = "no gradient: does not depend on xs" if t not in live else "no gradient flows (rule gives none)"
                    outgoing.append(Outgoing(sym, t, rule, None, why))
                    continue
                received[t] = received.get(t, 0) + 1
                note = ""
                if t in grads:
                    grads[t] = grads[t] + g
                    note = f"fan-out: contribution {received[t]} of {fan_in.get(t, 1)}, added to d{t}"
                else:
                    grads[t] = g
                    if fan_in.get(t, 1) > 1:
                        note = f"fan-out: contribution 1 of {fan_in[t]}; the others add to it"
                outgoing.append(Outgoing(sym, t, rule, g, note))
            yield Frame("reverse", index, graph.node_names[index], node.op_type,
                        tuple(t for t in node.input if t in values),
                        tuple(t for t in node.output if t in values), tuple(arriving), tuple(outgoing))
        out = {}
        for x in self.spec.xs:
            g = grads.get(x)
            out[x] = (g if g is not None else torch.zeros_like(values[x])).detach().cpu().numpy()
        self.grads = out


class _Recorder:
    """The forward pass's observer (a StepObserver, docs/python-api.md): keeps every value the pass
    reads or makes, emits a frame per node, and records each node that has a live float input on
    autograd's tape, with those inputs as leaves: the reverse pass then runs each node's backward
    without running its forward again (that second forward was a third of the reverse pass on
    densenet)."""

    def __init__(self, tracer: Tracer, emit, stop):
        self.tracer, self.emit, self.stop = tracer, emit, stop
        self.leaves: dict[str, torch.Tensor] = {}

    def source(self, name, value):
        self.tracer.values[name] = value
        return value

    def arguments(self, step, names, args):
        if self.stop():
            raise _Stopped
        t = self.tracer
        explicit = set(t.graph.nodes[step.node_index].input)  # not a control-flow op's outer values
        self.leaves = {}
        out = []
        for name, v in zip(names, args):
            if name is not None and v is not None:
                t.values[name] = v
                if name in explicit and name in t.live and isinstance(v, torch.Tensor) and v.is_floating_point():
                    if name not in self.leaves:  # Mul(A, A): one leaf, so autograd adds both uses
                        self.leaves[name] = v.detach().requires_grad_()
                    v = self.leaves[name]
            out.append(v)
        return out

    def outputs(self, step, args, names, outs):
        t = self.tracer
        if self.leaves:
            t.tape[step.node_index] = (self.leaves, list(outs))
        outs = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
        for name, v in zip(names, outs):
            if name is not None and v is not None:
                t.values[name] = v
        node = t.graph.nodes[step.node_index]
        if any(n in t.live for n in node.input):
            t.live.update(n for n in node.output if n)
        self.emit(Frame("forward", step.node_index, step.name, step.op_type,
                        tuple(n for n in node.input if n in t.values),
                        tuple(n for n in node.output if n in t.values),
                        tangents_in=tuple((n, t.tangents[n]) for n in dict.fromkeys(node.input) if n in t.tangents),
                        tangents_out=tuple((n, t.tangents[n]) for n in node.output if n in t.tangents)))
        return outs


def _vjp(taped, node, arriving: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gradients sent to each live float input of one node, given the gradients at its outputs;
    `taped`: the node's leaves and outputs as the forward pass recorded them (None: no live input)."""
    if taped is None:
        return {}
    leaves, outs = taped
    pairs = [(o, arriving[t]) for t, o in zip(node.output, outs)
             if t in arriving and isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs:
        return {}
    names = list(leaves)
    raw = torch.autograd.grad([o for o, _ in pairs], [leaves[n] for n in names],
                              [g.to(o.dtype) for o, g in pairs], allow_unused=True)
    return {n: g.detach() for n, g in zip(names, raw) if g is not None}
