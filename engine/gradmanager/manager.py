"""MegEngine's GradManager for ONNX models: attach names, record runs, accumulate vector-Jacobian products.

Semantics follow MegEngine's `autodiff.GradManager` (seed 003), with tensor names in place of
tensor objects:
- attach() persists across recordings; attaching a name again appends its callbacks.
- A name attached while recording that is an input or an intermediate names that recording's
  value only, and is dropped with it: the counterpart of MegEngine's weak references to
  temporary tensors. Its gradient starts empty, like a new tensor's `.grad`.
- backward() releases the recording; attached names that y does not reach keep their gradient.
- A backward is recorded by every manager (sharing the parameters) that started recording
  earlier, so gradients taken inside another manager's recording can be differentiated again.
What is checked of an attached value, y and dy is the prepared gradient call's own check
(`engine.gradient.prepared`: `leaf`, `float_y`, `seed_for`), as for every gradient front end.
"""
from __future__ import annotations

import itertools
import os
from typing import Iterator, Mapping, Sequence

import torch

from .. import load
from ..dtypes import parse_device, parse_float_dtype
from ..errors import FeedError, OnnxGradError, RecordingError, SelectionError
from ..gradient import prepared
from ..gradient.selection import names as parse_names
from ..gradient.selection import unknown_name
from ..model import Model
from ..run.plan import StepObserver
from .chains import Callback, Streams, check_chain
from .chains import apply as apply_chain
from .params import Parameters

_record_order = itertools.count()


class Gradients(Mapping[str, torch.Tensor]):
    """Read-only view of the accumulated gradients, by tensor name (parameters, inputs, intermediates)."""

    def __init__(self, params: Parameters):
        self._params = params

    def __getitem__(self, name: str) -> torch.Tensor:
        g = self._params.grad_of(name)
        if g is None:
            raise KeyError(f"no gradient for {name!r}: attach it, then record a run and call backward()")
        return g

    def __iter__(self) -> Iterator[str]:
        yield from (n for n, p in self._params.items() if p.grad is not None)
        yield from list(self._params.extra_grads)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{n!r}: shape {tuple(g.shape)}" for n, g in self.items()) + "}"


class GradManager:
    """Attach tensors of an ONNX model by name, record `run`s, and `backward` into `grad`.

        gm = GradManager(model, dtype="float64").attach(["W1", "b1"], callbacks=[clip])
        with gm:
            gm.run({"X": x})
            gm.backward("loss")          # or backward("Y", dy), or lists of both
        gm.grad["W1"]                    # accumulates until zero_grad()
    """

    def __init__(self, model: Model | str | os.PathLike | bytes, *, device=None, dtype=None,
                 params: Parameters | None = None):
        self.model = model if isinstance(model, Model) else load(model)
        if params is None:
            params = Parameters(self.model, parse_device(device), parse_float_dtype(dtype))
        elif params.model is not self.model:
            raise OnnxGradError("params belong to another model: share them only between managers of one Model")
        elif (device is not None and parse_device(device) != params.device) or (
                dtype is not None and parse_float_dtype(dtype) != params.dtype):
            raise OnnxGradError(f"params live on {params.device} as {params.dtype or 'native'} floats; "
                                "leave device and dtype out when sharing them")
        self.params = params
        self.grad = Gradients(params)
        self._attached: dict[str, list[Callback]] = {}
        self._temporary: dict[str, list[Callback]] = {}
        self._recording = False
        self._order = -1
        self._values: dict[str, torch.Tensor] = {}  # latest recorded value of every tensor, by name
        self._versions: dict[str, list[torch.Tensor]] = {}  # recorded values of attached non-parameters

    def __repr__(self) -> str:
        state = "recording" if self._recording else "idle"
        return f"<GradManager {self.model.name!r} {state}, attached {list(self.attached)}>"

    @property
    def recording(self) -> bool:
        return self._recording

    @property
    def attached(self) -> dict[str, tuple[Callback, ...]]:
        """Attached names and their callback chains, in attach order (temporary ones last)."""
        return {n: tuple(cbs) for n, cbs in itertools.chain(self._attached.items(), self._temporary.items())}

    def is_attached(self, name: str) -> bool:
        return name in self._attached or name in self._temporary

    # --- attach --------------------------------------------------------------------------------
    def attach(self, names: str | Sequence[str], callbacks: Callback | Sequence[Callback] | None = None) -> GradManager:
        """Track `names` (initializers, inputs or intermediates). Callbacks `(name, grad) -> grad`
        run in attach order on each backward's gradient before it is accumulated."""
        names = parse_names(names)
        cbs = [callbacks] if callable(callbacks) else list(callbacks or ())
        for cb in cbs:
            if not callable(cb):
                raise OnnxGradError(f"callback {cb!r} is not callable: a callback takes (name, grad) and returns grad")
        for name in names:
            self._check_attachable(name)
            check_chain(name, [*self.attached.get(name, ()), *cbs], name in self.params)
        for name in names:
            if name in self._attached:
                self._attached[name].extend(cbs)
            elif name in self._temporary:
                self._temporary[name].extend(cbs)
            elif self._recording and name not in self.params:
                self._temporary[name] = list(cbs)
                self.params.extra_grads.pop(name, None)
            else:
                self._attached[name] = list(cbs)
        return self

    def _check_attachable(self, name: str) -> None:
        graph = self.model.graph
        if not graph.has_tensor(name):
            raise unknown_name(graph, name, "attached name")
        info = graph.types.get(name)
        if info is not None and info.elem_type is not None and not info.is_float:
            from ..dtypes import onnx_type_name

            raise SelectionError(f"{name!r} is {onnx_type_name(info.elem_type)}: only float tensors can be attached")

    # --- record / release ----------------------------------------------------------------------
    def record(self) -> None:
        """Start recording: `run`s from now on can be differentiated by `backward`."""
        if self._recording:
            raise RecordingError("this GradManager is already recording: it records one history at a time "
                                 "(backward() or release() ends it; nest a second manager for higher order)")
        self._recording = True
        self._order = next(_record_order)
        self.params.recorders.append(self)

    def release(self) -> None:
        """Stop recording and drop the recorded history and the temporary attaches."""
        if self in self.params.recorders:
            self.params.recorders.remove(self)
        self._recording = False
        self._values, self._versions, self._temporary = {}, {}, {}

    def __enter__(self) -> GradManager:
        self.record()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # --- forward -------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, object] | None = None, outputs: str | Sequence[str] | None = None
            ) -> dict[str, torch.Tensor]:
        """Run the model on the current parameters; recorded by every recording manager sharing them.

        Feeds may set inputs (and intermediates, which cuts the graph there as in `Model.run`), not
        parameters. Returns torch tensors of `outputs` (default: the graph outputs)."""
        model, graph = self.model, self.model.graph
        feeds = dict(feeds or {})
        model.check_feed_names(feeds)
        for name in feeds:
            if name in self.params:
                raise FeedError(f"{name!r} is a parameter: change gm.params[{name!r}] in place instead of feeding it")
        targets = list(parse_names(outputs)) if outputs is not None else model.outputs
        for t in targets:
            if not graph.has_tensor(t):
                raise FeedError(f"output {t!r} is not a tensor of this model")
        device, dtype = self.params.device, self.params.dtype
        recorders = list(self.params.recorders)
        # An attached input left to its initializer default must enter as a source to be tracked.
        defaults = [n for n in sorted(graph.overridable) if n not in feeds and any(r.is_attached(n) for r in recorders)]
        constants = model.constants(device, dtype)
        plan = model.prepare(list(feeds) + defaults + list(self.params), targets, device=device, dtype=dtype)
        values = [model.to_tensor(n, v, device, dtype) for n, v in feeds.items()]
        values += [constants[n] for n in defaults]
        # Unattached parameters enter detached: computation on a tensor before its attach is ignored.
        values += [p if any(r.is_attached(n) for r in recorders) else p.detach() for n, p in self.params.items()]
        if not recorders:
            with torch.no_grad():
                return dict(zip(targets, plan.run(values)))
        with torch.enable_grad():
            if any(n not in self.params for r in recorders for n in r.attached):
                return dict(zip(targets, plan.run_observed(values, _Tape(recorders, self.params))))
            # Only parameters attached: nothing to turn into a leaf mid-run, so the plan's compiled
            # module computes every value (no Python per node) and the tape only files them by name.
            computed = plan.run_all(values)
            for r in recorders:
                r._values.update(computed)
            return {t: computed[t] for t in targets}

    # --- backward ------------------------------------------------------------------------------
    def backward(self, y=None, dy=None) -> None:
        """Accumulate dy·∂y/∂x into `grad[x]` for every attached x, then release the recording.

        `y`: a tensor name, a torch tensor computed from recorded outputs, or a list of them; `dy`
        defaults to ones shaped like each y (the gradient of sum(y), as in MegEngine)."""
        if not self._recording:
            raise RecordingError("nothing recorded: call gm.record() or enter `with gm:` before gm.run(), "
                                 "then gm.backward()")
        try:
            self._backward(y, dy)
        finally:
            self.release()

    def _backward(self, y, dy) -> None:
        listed = isinstance(y, (list, tuple))
        ys = self._resolve_ys(y)
        dys = self._resolve_dys(ys, dy, listed)
        pairs = [(t, d) for t, d in zip(ys, dys) if t.requires_grad]
        chunks: list[tuple[str, list[torch.Tensor]]] = []
        for name in self.attached:
            versions = [self.params[name]] if name in self.params else self._versions.get(name, [])
            chunks.append((name, [v for v in versions if v.requires_grad]))
        flat = [v for _, vs in chunks for v in vs]
        others = [r for r in self.params.recorders if r is not self]
        older = any(r._order < self._order for r in others)
        attached = self.attached
        streams = Streams(self, attached)
        raw: Sequence[torch.Tensor | None] = [None] * len(flat)
        try:
            if pairs and flat:
                with streams.watching():
                    raw = torch.autograd.grad([t for t, _ in pairs], flat, [d for _, d in pairs], allow_unused=True,
                                              retain_graph=bool(others), create_graph=older)
            results, k = {}, 0
            for name, versions in chunks:
                grads = [g for g in raw[k:k + len(versions)] if g is not None]
                k += len(versions)
                if not grads or name in streams.chains:
                    continue
                if len({tuple(g.shape) for g in grads}) > 1:
                    raise FeedError(f"{name!r} was recorded with different shapes in one recording; "
                                    "call backward() after each run")
                g = grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)
                results[name] = apply_chain(name, g, attached[name])
            results.update(streams.finish())
        except BaseException:
            streams.abort()
            raise
        for name, g in results.items():
            self.params.accumulate(name, g, keep_graph=older)

    def _resolve_ys(self, y) -> list[torch.Tensor]:
        items = [] if y is None else list(y) if isinstance(y, (list, tuple)) else [y]
        out = []
        for item in items:
            if isinstance(item, str):
                if not self.model.graph.has_tensor(item):
                    raise unknown_name(self.model.graph, item, "y")
                if item not in self._values:
                    raise SelectionError(f"y {item!r} was not computed by a recorded gm.run(); "
                                         "record first, and list it in outputs= if no graph output needs it")
                t, label = self._values[item], repr(item)
            elif isinstance(item, torch.Tensor):
                t, label = item, "tensor"
            else:
                raise OnnxGradError(f"y must be a tensor name or a torch tensor, not {type(item).__name__}")
            prepared.float_y(t, label)
            out.append(t)
        return out

    def _resolve_dys(self, ys: list[torch.Tensor], dy, listed: bool) -> list[torch.Tensor]:
        """One seed per y: a list of them when y was a list, else one value (which may itself be a list)."""
        if dy is None:
            return [prepared.seed_for(t) for t in ys]
        if listed and not isinstance(dy, (list, tuple)):
            raise FeedError("y is a list, so dy must be a list too: one dy per y")
        dys = list(dy) if listed else [dy]
        if len(dys) != len(ys):
            raise FeedError(f"{len(dys)} dy value(s) for {len(ys)} y tensor(s): give one dy per y")
        return [prepared.seed_for(t, d) for t, d in zip(ys, dys)]

    # --- gradients and parameters --------------------------------------------------------------
    def zero_grad(self, names: str | Sequence[str] | None = None) -> None:
        """Forget accumulated gradients: all of them, or those of `names`."""
        self.params.zero_grad(None if names is None else parse_names(names))

    def save(self, path: str | os.PathLike, external_data: bool | None = None, all_ranks: bool = False) -> bool:
        """Write the model with the parameters' current values; everything else as loaded. The
        weights go to PATH.data when the model is over protobuf's 2 GB, or when `external_data` is
        True. In a torch.distributed process group only rank 0 writes, unless `all_ranks`; returns
        whether this process wrote the file."""
        from ..distributed.group import rank

        if not all_ranks and rank() != 0:
            return False
        self.params.save(path, external_data=external_data)
        return True


class _Tape(StepObserver):
    """Puts every value of a run into the recording managers' histories; attached inputs and
    intermediates become tensors that autograd can differentiate with respect to."""

    def __init__(self, recorders: list[GradManager], params: Parameters):
        self.recorders, self.params = recorders, params

    def _see(self, name: str | None, value):
        if name is None or not isinstance(value, torch.Tensor):
            return value
        watchers = [r for r in self.recorders if r.is_attached(name)]
        if watchers and name not in self.params:
            value = prepared.leaf(name, value, "be attached")
            for r in watchers:
                r._versions.setdefault(name, []).append(value)
        for r in self.recorders:
            r._values[name] = value
        return value

    def source(self, name, value):
        return self._see(name, value)

    def outputs(self, step, args, names, outs):
        return [self._see(n, v) for n, v in zip(names, outs)]
