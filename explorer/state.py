"""The explorer's session: model, selection, feeds, device/dtype and the last results. No Textual.

Widgets read this object and ask it to change; long computations run on frozen jobs it hands
out, so a worker thread never reads state the UI is changing. Every change bumps `generation`,
and a result that comes back for an older generation is dropped instead of shown as current.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

import engine
from engine.errors import FeedError, SelectionError
from engine.gradient.feeds import default_spec
from engine.gradient.past_feeds import coherent_dims, past_plan

from .feeding import MADE_UP, FeedSource, materialize, source_from
from .jobs import VALUES_BUDGET, CheckJob, CheckOptions, GradientJob, ValuesJob, intermediate_bytes
from .summaries import SummaryCache, summarize

VIEWS = ("forward", "backward", "combined")
DTYPES = ("float32", "float64")
CHECK_MODES = ("auto", "full", "sample", "fast")  # engine.verify.MODES, without importing the verifier here


def available_devices() -> tuple[str, ...]:
    import torch

    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


@dataclass
class Session:
    model: engine.Model
    label: str
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    view: str = "forward"
    y: str | None = None
    xs: tuple[str, ...] = ()
    zs: tuple[str, ...] = ()
    feeds: dict[str, FeedSource] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)  # symbolic dims set in the dims dialog (else 1)
    check_options: CheckOptions = field(default_factory=CheckOptions)
    generation: int = 0
    # Forward values seen so far, all computed at the feeds, device and dtype of values_generation,
    # which only those bump (a new selection keeps them).
    values: dict[str, np.ndarray] = field(default_factory=dict)
    values_generation: int = 0
    values_one_by_one: bool = False  # the pass over everything failed or would not fit: per tensor
    gradient: object | None = None  # engine.GradientResult of the current generation
    gradient_stats: object | None = None
    gradient_origin: object | None = None  # engine Finding: where the gradient's NaN/Inf comes from
    check: object | None = None  # engine CheckReport of the current generation
    diff: object | None = None  # explorer.diff_state.DiffShown: the diff on screen (diff mode), else None
    summaries: SummaryCache = field(default_factory=SummaryCache, repr=False)  # of values and gradients shown
    spec: engine.GradientSpec | None = None
    selection_error: str | None = None
    missing_inputs: tuple[str, ...] = ()  # graph inputs y needs that are in neither xs nor zs
    _slice: tuple | None = field(default=None, repr=False)
    _intermediate_bytes: tuple | None = field(default=None, repr=False)  # (dims, what one pass holds)
    _feeds_made: tuple | None = field(default=None, repr=False)  # (what they were made from, feed values)

    @property
    def graph(self) -> engine.GraphIndex:
        return self.model.graph

    # --- selection ---------------------------------------------------------------------------
    def set_y(self, name: str) -> None:
        self.y = name
        self.xs = tuple(n for n in self.xs if n != name)
        self.zs = tuple(n for n in self.zs if n != name)
        self._selection_changed()

    def toggle_x(self, name: str) -> None:
        self.xs = tuple(n for n in self.xs if n != name) if name in self.xs else self.xs + (name,)
        self.zs = tuple(n for n in self.zs if n != name)
        self.y = None if self.y == name else self.y
        self._selection_changed()

    def toggle_z(self, name: str) -> None:
        self.zs = tuple(n for n in self.zs if n != name) if name in self.zs else self.zs + (name,)
        self.xs = tuple(n for n in self.xs if n != name)
        self.y = None if self.y == name else self.y
        self._selection_changed()

    def select(self, y: str | None, xs=(), zs=()) -> None:
        self.y, self.xs, self.zs = y, tuple(xs), tuple(zs)
        self._selection_changed()

    def clear_selection(self) -> None:
        self.select(None)

    def select_from_gradient_node(self) -> bool:
        """Take (y, xs, zs) from the model's first Gradient node, as the spec example has one."""
        from onnx import helper

        for node in self.graph.nodes:
            if node.op_type == "Gradient":
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                if "y" in attrs and "xs" in attrs:
                    self.select(attrs["y"].decode(), [v.decode() for v in attrs["xs"]],
                                [v.decode() for v in attrs.get("zs", [])])
                    return True
        return False

    def role_of(self, tensor: str) -> str | None:
        if tensor == self.y:
            return "y"
        return "x" if tensor in self.xs else "z" if tensor in self.zs else None

    def _selection_changed(self) -> None:
        self.spec, self.selection_error = None, None
        self.missing_inputs = self.needed_inputs()
        if not self.y or not self.xs:
            missing = "y" if not self.y else "xs"
            hint = "press y on a tensor" if not self.y else "press x on a tensor"
            self.selection_error = f"incomplete: {hint} to choose {missing}" if (self.y or self.xs or self.zs) else None
        else:
            try:
                self.spec = self.model.selection(self.y, self.xs, self.zs)
            except SelectionError as exc:
                self.selection_error = str(exc)
        self._invalidate(values=False)

    def needed_inputs(self) -> tuple[str, ...]:
        """Graph inputs y depends on that are in neither xs nor zs (the `i` key puts them in zs)."""
        return self.model.needed_inputs(self.y, self.xs, self.zs) if self.y else ()

    def add_needed_inputs(self) -> tuple[str, ...]:
        added = self.needed_inputs()
        if added:
            self.select(self.y, self.xs, self.zs + added)
        return added

    def x_elements(self) -> int:
        """How many elements the members of xs hold (declared shapes; unknown dims count 1)."""
        from engine.gradient.feeds import declared_shape

        total = 0
        for x in self.xs:
            try:
                total += int(np.prod(declared_shape(self.graph, x, self.dims)))
            except FeedError:
                continue
        return total

    def slice_nodes(self) -> frozenset[int]:
        """Indices of nodes on some path from xs to y in the graph cut at xs ∪ zs (cached per spec)."""
        if self.spec is None:
            return frozenset()
        cached = self._slice
        if cached is None or cached[0] != self.spec:
            cached = self._slice = (self.spec, active_nodes(self.graph, self.spec.y, self.spec.xs, self.spec.zs))
        return cached[1]

    # --- feeds -------------------------------------------------------------------------------
    def default_source(self, name: str) -> FeedSource | None:
        """A graph input nobody fed gets the engine's default (`engine.gradient.feeds.default_spec`, as the CLI):
        seeded random floats, zeros for integer and bool inputs."""
        if name not in self.graph.inputs:
            return None
        return self._default(name, past_plan(self.graph, self.dims))  # an LLM with past: as the CLI makes it up

    def _default(self, name: str, plan) -> FeedSource:
        spec = default_spec(self.graph, name, self.seed)
        if plan is not None:
            value, spec, _ = plan.choose(self.graph, name, spec, self.seed)
            if value is not None:
                return FeedSource(MADE_UP, expression=spec)
        return source_from("", spec)

    def feed_source(self, name: str) -> tuple[FeedSource | None, bool]:
        """(source, explicit): what feeds `name`, and whether the user chose it."""
        if name in self.feeds:
            return self.feeds[name], True
        return self.default_source(name), False

    def set_feed(self, name: str, source: FeedSource) -> None:
        """Feed `name`; raises FeedError (nothing changed) when the value cannot be made."""
        if not self.graph.has_tensor(name):
            raise FeedError(f"{name!r} is not a tensor of this model")
        trial = self._sources() | {name: source}
        self._materialize(trial)
        self.feeds[name] = source
        self._invalidate(values=True)

    def set_dims(self, dims: Mapping[str, int]) -> None:
        """Size the model's symbolic dims; raises FeedError (nothing changed) for an unknown name or a
        size a fed value contradicts."""
        from engine.gradient.dims import check_dims

        dims = check_dims(self.graph, dims)
        self._materialize(self._sources(), dims)
        self.dims = dims
        self._invalidate(values=True)

    def dims_text(self) -> str | None:
        """"batch=1 seq=16" for every symbolic dim of the inputs, or None when they have none."""
        from engine.gradient.dims import symbolic_dims

        names, sizes = symbolic_dims(self.graph), coherent_dims(self.graph, self.dims)  # an LLM's past, as made up
        return " ".join(f"{d}={sizes.get(d, 1)}" for d in names) or None

    def clear_feed(self, name: str) -> None:
        if self.feeds.pop(name, None) is not None:
            self._invalidate(values=True)

    def _sources(self) -> dict[str, FeedSource]:
        plan = past_plan(self.graph, self.dims)  # once for every input: it walks the graph's past inputs
        out = {n: self._default(n, plan) for n in self.graph.inputs}
        out.update(self.feeds)
        return out

    def _materialize(self, sources: Mapping[str, FeedSource], dims=None) -> dict[str, np.ndarray]:
        def constant(name):
            if name in self.graph.initializers:
                return self.model.constants()[name].detach().cpu().numpy()
            return None

        return materialize(self.graph, sources, constant, self.dims if dims is None else dims)

    def feed_values(self) -> dict[str, np.ndarray]:
        """Made once per values_generation: every job shares them (a random feed of GPT-2's embedding
        is 147 MB, and each run, check, trace and values pass held a copy of its own)."""
        key = (self.values_generation, tuple(self.feeds.items()), tuple(self.dims.items()), self.seed)
        if self._feeds_made is None or self._feeds_made[0] != key:
            self._feeds_made = (key, self._materialize(self._sources()))
        return dict(self._feeds_made[1])

    # --- device, dtype, view ---------------------------------------------------------------------
    def cycle_device(self) -> str:
        devices = available_devices()
        self.device = devices[(devices.index(self.device) + 1) % len(devices)] if self.device in devices else "cpu"
        self._invalidate(values=True)
        return self.device

    def toggle_dtype(self) -> str:
        self.dtype = DTYPES[(DTYPES.index(self.dtype) + 1) % len(DTYPES)]
        self._invalidate(values=True)
        return self.dtype

    def cycle_view(self) -> str:
        self.view = VIEWS[(VIEWS.index(self.view) + 1) % len(VIEWS)]
        return self.view

    def _invalidate(self, values: bool) -> None:
        self.generation += 1
        self.gradient = self.gradient_stats = self.gradient_origin = self.check = None
        if values:
            self.values = {}
            self.values_generation += 1
            self.values_one_by_one = False

    # --- jobs and results ----------------------------------------------------------------------
    def require_spec(self) -> engine.GradientSpec:
        if self.spec is None:
            raise SelectionError(self.selection_error or "nothing selected: press y on a tensor, then x on another")
        return self.spec

    def gradient_job(self) -> GradientJob:
        return GradientJob(self.model, self.require_spec(), self.feed_values(), self.device, self.dtype,
                           self.generation, self.seed, dict(self.dims))

    def check_job(self, options: CheckOptions | None = None) -> CheckJob:
        if options is not None:
            self.check_options = options
        return CheckJob(self.model, self.require_spec(), self.feed_values(), self.device, self.check_options,
                        self.generation, dict(self.dims))

    def values_job(self, names) -> "ValuesJob | None":
        """A job computing the forward values of `names` not seen yet, or None when none is missing.

        Fed tensors are answered here at once; anything else starts one pass computing every value
        (unless the model's intermediates would not fit VALUES_BUDGET, or that pass failed)."""
        missing = [n for n in names if n not in self.values and self.graph.has_tensor(n)]
        if not missing:
            return None
        feeds = self.feed_values()
        self.values.update({n: feeds[n] for n in missing if n in feeds})
        missing = [n for n in missing if n not in feeds]
        if not missing:
            return None
        if self._intermediate_bytes is None or self._intermediate_bytes[0] != self.dims:
            self._intermediate_bytes = (dict(self.dims), intermediate_bytes(self.graph, self.dims))
        one_by_one = self.values_one_by_one or self._intermediate_bytes[1] > VALUES_BUDGET
        return ValuesJob(self.model, feeds, tuple(missing) if one_by_one else (), self.device, self.dtype,
                         self.values_generation)

    def accept_values(self, generation: int, values: Mapping[str, np.ndarray], everything: bool = False) -> bool:
        if generation != self.values_generation:
            return False
        self.values.update(values)
        # After the pass over everything, what is still missing is asked for by name (never again
        # by a whole pass that would not have it either).
        self.values_one_by_one = self.values_one_by_one or everything
        return True

    def accept_gradient(self, generation: int, result, stats, origin=None, summaries=None) -> bool:
        """`summaries`: of each x's gradient, made in the worker (the results table shows them)."""
        if generation != self.generation:
            return False
        self.gradient, self.gradient_stats, self.gradient_origin = result, stats, origin
        for name, summary in (summaries or {}).items():
            self.summaries.put("gradient", name, result.grads[name], summary)
        self.values.update(getattr(result, "values", {}) or {})
        if self.spec is not None:
            self.values[self.spec.y] = result.y
        return True

    def gradient_summary(self, name: str):
        """The summary of the gradient of x `name` (made by the gradient's worker; here if it is not)."""
        grad = self.gradient.grads[name]
        summary = self.summaries.get("gradient", name, grad)
        if summary is None:
            summary = summarize(grad)
            self.summaries.put("gradient", name, grad, summary)
        return summary

    def accept_check(self, generation: int, report) -> bool:
        if generation != self.generation:
            return False
        self.check = report
        return True

    # --- export --------------------------------------------------------------------------------
    def report(self) -> dict:
        """The session as JSON-ready data: selection, feeds, settings, gradient stats, check report."""
        out: dict = {
            "model": self.label, "y": self.y, "xs": list(self.xs), "zs": list(self.zs),
            "device": self.device, "dtype": self.dtype, "dims": dict(self.dims),
            "feeds": {n: s.describe() for n, s in self._sources().items()},
            "selection_error": self.selection_error,
        }
        if self.gradient is not None:
            out["gradients"] = {n: self.gradient_summary(n).as_dict() | {"disconnected": n in self.gradient.disconnected}
                                for n in self.gradient.grads}
        if self.check is not None:
            data = self.check.to_json()
            out["check"] = json.loads(data) if isinstance(data, str) else data
        return out


def open_session(model_path: str | None = None, *, model: engine.Model | None = None, label: str | None = None,
                 ops: tuple[str, ...] = (), **settings) -> tuple[Session | None, str | None]:
    """(session, None), or (None, the one-line reason the model or an `ops` file cannot be loaded).

    Neither a path nor a model: the bundled spec example (Conv -> Gemm with its Gradient node).
    """
    import os

    from engine.opsfile import load_ops_file

    from .guard import one_line

    try:
        for path in ops:
            load_ops_file(path)
    except engine.OnnxGradError as exc:
        return None, str(exc)
    if model is None:
        try:
            if model_path is None:
                from engine import examples

                model, label = engine.load(examples.spec_conv_gemm()), label or "spec_conv_gemm"
            else:
                model = engine.load(model_path)
        except Exception as exc:  # a corrupt file can fail below our loader too: still one line
            return None, one_line(exc)
    name = label or (os.path.basename(model.graph.path or model_path) if model_path else model.name)  # a folder: its model
    return Session(model, name, **settings), None


def active_nodes(graph, y: str, xs, zs) -> frozenset[int]:
    """Nodes computing y from xs ∪ zs (cut there) that read something depending on xs."""
    members = set(xs) | set(zs)
    needed, stack, seen = set(), [y], set()
    while stack:
        t = stack.pop()
        if t in seen or not t or t in members:
            continue
        seen.add(t)
        if t in graph.producer:
            i = graph.producer[t]
            needed.add(i)
            stack.extend(graph.nodes[i].input)
    live, on = set(xs), set()
    for i in sorted(needed):
        node = graph.nodes[i]
        if any(t in live for t in node.input):
            on.add(i)
            live.update(t for t in node.output if t)
    return frozenset(on)
