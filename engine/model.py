"""The public Model: load once, run or differentiate many times on any device and dtype."""
from __future__ import annotations

import copy
from typing import Mapping, Sequence

import numpy as np
import torch
from onnx import helper

from .dtypes import parse_device, parse_float_dtype, to_numpy
from .errors import FeedError, UnsupportedOpError
from .gradient.call import GradientCall
from .gradient.feed_checks import check_feed
from .gradient.prepared import GradientResult, PreparedGradient
from .gradient.selection import GradientSpec, check_gradient_node, names, node_selection, validate
from .modelfile.index import TRAINING_DOMAIN, GraphIndex, node_inputs
from .registry import require
from .registry import version as registry_version
from .run.constants import Constants
from .run.pacing import paced, pause_point
from .run.plan import Plan, needed_nodes
from .run.recent import Recent
from .run.values import array_to_tensor

PLANS_KEPT = 64  # plans and prepared gradients per model, the most recently used
SELECTIONS_KEPT = 512


class Model:
    """A loaded ONNX model. A node whose op is not registered does not stop the load: it is listed
    by `unsupported_nodes()`, and only a run or gradient that reaches it fails (one line)."""

    def __init__(self, graph: GraphIndex, compile: bool = False):
        self.graph = graph
        self.compile = compile  # plans run their fx module under torch.compile (see docs/compile.md)
        for i, node in enumerate(graph.nodes):
            if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
                check_gradient_node(graph, i)
        self._unsupported: tuple[int, dict[int, str]] | None = None
        self._constants = Constants(graph)
        self._plans: Recent[tuple, Plan] = Recent(PLANS_KEPT)
        self._grads: Recent[tuple, PreparedGradient] = Recent(PLANS_KEPT)
        # Per-call overhead of `gradient`: validation and the cut-graph walk depend only on names.
        self._selections: Recent[tuple, GradientSpec] = Recent(SELECTIONS_KEPT)
        self._extras: Recent[tuple, tuple[str, ...]] = Recent(SELECTIONS_KEPT)
        self._calls: Recent[tuple, GradientCall] = Recent(PLANS_KEPT)  # gradient_call's, per names
        self._forward: Recent[tuple, object] = Recent(PLANS_KEPT)  # prepared JVPs and HVPs

    # --- description -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def inputs(self) -> list[str]:
        """Graph inputs that must be fed (initializers excluded)."""
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def unsupported_nodes(self) -> dict[int, str]:
        """Node index -> the one-line reason its op cannot run (no registered implementation).

        Looked up again whenever the registry changes, so an op registered after the load counts.
        """
        if self._unsupported is None or self._unsupported[0] != registry_version():
            found, runs = {}, {}  # runs: one registry look-up per (domain, op, opset), not per node
            for i, node in enumerate(self.graph.nodes):
                if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
                    continue
                op = (node.domain, node.op_type, self.graph.opset(node.domain))
                if runs.get(op, False):
                    continue
                try:
                    require(*op, self.graph.node_names[i])
                    runs[op] = True
                except UnsupportedOpError as exc:
                    found[i] = str(exc)
            self._unsupported = (registry_version(), found)
        return dict(self._unsupported[1])

    def blocked(self, targets: Sequence[str], feeds: Sequence[str] = ()) -> dict[str, int]:
        """Target -> the first unsupported node computing it from `feeds` needs, for the targets
        that cannot be computed; the others run."""
        bad = self.unsupported_nodes()
        if not bad:
            return {}
        out = {}
        for t in targets:
            hit = next((i for i in needed_nodes(self.graph, set(feeds), [t])[0] if i in bad), None)
            if hit is not None:
                out[t] = hit
        return out

    def unsupported_summary(self) -> str | None:
        """One line on the nodes that cannot run (None when every op is supported)."""
        bad = self.unsupported_nodes()
        if not bad:
            return None
        ops = {}
        for i in bad:
            node = self.graph.nodes[i]
            ops.setdefault(f"{node.domain}::{node.op_type}" if node.domain else node.op_type, []).append(i)
        parts = [f"{op} ({', '.join(self.graph.node_names[i] for i in idx[:3])}{', ...' if len(idx) > 3 else ''})"
                 for op, idx in ops.items()]
        return (f"{len(bad)} node(s) use ops onnxgrad cannot run: {'; '.join(parts)}. Runs and gradients that "
                "avoid them work; register an op with --ops FILE.py")

    def __repr__(self) -> str:
        return f"<Model {self.name!r}: {len(self.graph.nodes)} nodes, inputs {self.inputs}, outputs {self.outputs}>"

    # --- forward ---------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, object] | None = None, *, outputs: Sequence[str] | None = None,
            device="cpu", dtype=None, compile: bool | None = None) -> dict[str, np.ndarray]:
        """Run the graph. `feeds` may set any tensor, intermediates included; returns numpy arrays."""
        dev, fdt = parse_device(device), parse_float_dtype(dtype)
        feeds = dict(feeds or {})
        targets = list(outputs) if outputs is not None else self.outputs
        for t in targets:
            if not self.graph.has_tensor(t):
                raise FeedError(f"output {t!r} is not a tensor of this model{self.graph.did_you_mean(t)}")
        self.check_feed_names(feeds)
        # An initializer asked for is looked up, not held by a plan: a plan keeps its targets that are
        # constants converted, and GPT-2's embedding in float64 stayed 0.29 GB for as long as the plan.
        weights = {t for t in targets if t in self.graph.initializers and t not in feeds}
        computed = [t for t in targets if t not in weights]
        out = {}
        if computed:
            plan = self.prepare(list(feeds), computed, device=dev, dtype=fdt, compile=compile)
            values = [self.to_tensor(n, feeds[n], dev, fdt) for n in plan.sources]
            with torch.no_grad():
                out = dict(zip(computed, plan.run(values)))
        constants = self.constants(dev, fdt)
        return {t: self._to_numpy(t, constants[t] if t in weights else out[t]) for t in targets}

    def run_all(self, feeds: Mapping[str, object] | None = None, *, device="cpu", dtype=None) -> dict[str, np.ndarray]:
        """Every value one forward pass from `feeds` can give: the feeds, the initializers read and
        each node's outputs (for inspecting intermediates). What needs an op that cannot run is
        left out; `blocked` says which node stops it."""
        dev, fdt = parse_device(device), parse_float_dtype(dtype)
        feeds = dict(feeds or {})
        self.check_feed_names(feeds)
        bad, stopped = self.unsupported_nodes(), set()
        targets = []
        for i, node in enumerate(self.graph.nodes):  # topological: one pass finds what the bad nodes stop
            if not i & 255:
                pause_point()
            outs = [t for t in node.output if t and t not in feeds]
            if i in bad or any(t in stopped for t in node_inputs(node)):
                stopped.update(outs)
            else:
                targets += outs
        plan = self.prepare(list(feeds), targets, device=dev, dtype=fdt, keep_all=True)
        values = [self.to_tensor(n, feeds[n], dev, fdt) for n in plan.sources]
        with torch.no_grad():  # once per feeds: the interpreter, not an fx module built for one call
            env = plan.interpret_all(values)
        out = {}
        for t, v in paced(env.items()):  # thousands of values on a big model
            out[t] = self._to_numpy(t, v)
        return out

    def prepare(self, sources: Sequence[str], targets: Sequence[str], *, device="cpu", dtype=None,
                keep_all: bool = False, compile: bool | None = None) -> Plan:
        """A Plan computing `targets` from `sources`: call `plan.run([tensors...])` repeatedly.
        `compile` (default: the model's `compile`) runs it under torch.compile."""
        dev, fdt = parse_device(device), parse_float_dtype(dtype)
        mode = "compile" if (self.compile if compile is None else compile) else None
        key = (tuple(sources), tuple(targets), str(dev), fdt, keep_all, mode)
        plan = self._plans.get(key)
        if plan is None:
            plan = Plan(self.graph, sources, targets, device=dev, float_dtype=fdt,
                        constants=self.constants(dev, None), gradient_step=self._gradient_step(dev, fdt),
                        keep_all=keep_all, mode=mode)
            self._plans[key] = plan
        return plan

    def constants(self, device="cpu", dtype=None) -> Mapping[str, torch.Tensor]:
        """Initializers as torch tensors on `device` (floats promoted to `dtype` when given), each
        converted when first looked up and cached: on the CPU in the model's own types they share
        memory with the weights as read (no copy), and what no plan reads is never read."""
        return self._constants.tensors(parse_device(device), parse_float_dtype(dtype))

    # --- gradients -------------------------------------------------------------------------------
    def selection(self, y: str, xs, zs=()) -> GradientSpec:
        """Validate (y, xs, zs) as the Gradient operator defines them; raises SelectionError."""
        key = (y, names(xs), names(zs))
        spec = self._selections.get(key)
        if spec is None:
            spec = self._selections[key] = validate(self.graph, y, xs, zs)
        return spec

    def needed_inputs(self, y: str, xs=(), zs=()) -> tuple[str, ...]:
        """Graph inputs y depends on around xs ∪ zs that are in neither (what zs still lacks)."""
        from .gradient.selection import needed_inputs

        return needed_inputs(self.graph, y, xs, zs) if self.graph.has_tensor(y) else ()

    def prepare_gradient(self, y: str, xs, zs=(), *, device="cpu", dtype=None,
                         extra_inputs: Sequence[str] = (), compile: bool | None = None) -> PreparedGradient:
        """Compile dy/dxs once; call the result with torch tensors (xs, then zs, then extra_inputs)."""
        spec = self.selection(y, xs, zs)
        dev, fdt = parse_device(device), parse_float_dtype(dtype)
        compile = self.compile if compile is None else compile
        key = (spec, tuple(extra_inputs), str(dev), fdt, compile)
        prepared = self._grads.get(key)
        if prepared is None:
            plan = self.prepare(spec.inputs + tuple(extra_inputs), [spec.y], device=dev, dtype=fdt, compile=compile)
            prepared = self._grads[key] = PreparedGradient(spec, plan)
        return prepared

    def gradient(self, y: str, xs, zs=(), feeds: Mapping[str, object] | None = None, dy=None, *,
                 device="cpu", dtype=None, seed: int = 0, compile: bool | None = None,
                 dims: Mapping[str, int] | None = None, past: int | None = None) -> GradientResult:
        """dy/dx for each x in xs, at the values in `feeds`.

        A member of xs ∪ zs without a feed takes the shared default (`selection_values`, seeded by
        `seed`, its symbolic dims sized by `dims`, e.g. {"seq": 32}; for an LLM with past key values,
        `past` positions cached, as `--past N`). Feeds may also override
        initializers that are graph inputs. Feeds
        for tensors the cut graph does not read are ignored; a feed for a tensor *inside* the cut
        graph is refused, since it would silently change what is differentiated.
        """
        feeds = feeds if feeds is not None else {}
        if past is not None:
            from .gradient.past_feeds import with_past

            dims = with_past(self.graph, dims, past)
        return self.gradient_call(y, xs, zs, feeds, device=device, dtype=dtype, compile=compile)(feeds, dy, seed, dims)

    def gradient_call(self, y: str, xs, zs=(), feeds=(), *, device="cpu", dtype=None,
                      compile: bool | None = None) -> GradientCall:
        """The call `gradient` makes for these names and the names of `feeds` (a mapping or names):
        `call(feeds, dy, seed, dims)` -> GradientResult; `call.inputs(feeds, seed, dims)` -> the
        tensors `call.prepared` (the PreparedGradient) takes, and the values they hold. Checked here
        once: the selection, the feed names, and no feed inside the cut graph."""
        xs, zs = names(xs), names(zs)
        compile = self.compile if compile is None else compile
        key = (y, xs, zs, tuple(feeds), str(device), str(dtype), compile)
        call = self._calls.get(key)
        if call is None:
            spec = self.selection(y, xs, zs)
            self.check_feed_names(feeds)
            dev, fdt = parse_device(device), parse_float_dtype(dtype)
            extras = self.gradient_extras(spec, dict.fromkeys(feeds))
            prepared = self.prepare_gradient(y, xs, zs, device=dev, dtype=fdt, extra_inputs=extras, compile=compile)
            call = GradientCall(self, prepared, tuple(feeds), self._constants.tensors(dev, fdt),
                                self._constants.arrays(dev, fdt))
            self._calls[key] = call
        return call

    def selection_values(self, spec: GradientSpec, feeds: Mapping[str, object], seed: int = 0,
                         names: Sequence[str] | None = None, dims: Mapping[str, int] | None = None,
                         past: int | None = None) -> dict[str, np.ndarray]:
        """A value for every member of xs ∪ zs (or of `names`): the feed, else the shared default
        (`feeds.defaults_for`: the initializer, a seeded default for a graph input, the forward
        value for an intermediate)."""
        from .gradient.dims import check_dims
        from .gradient.feeds import defaults_for
        from .gradient.past_feeds import with_past

        names = spec.inputs if names is None else names
        dims = with_past(self.graph, check_dims(self.graph, dims), past)
        defaults, _ = defaults_for(self, names, feeds, seed=seed, dims=dims)
        out = {}
        for n in names:
            v = feeds[n] if n in feeds else defaults[n]
            out[n] = to_numpy(v) if isinstance(v, torch.Tensor) else np.asarray(v)
        return out

    def gradient_extras(self, spec: GradientSpec, feeds: Mapping[str, object]) -> tuple[str, ...]:
        """Fed initializers the cut graph reads (overrides, passed after xs and zs); refuses interior feeds."""
        from .gradient.feeds import gradient_extras

        key = (spec, tuple(sorted(feeds)))
        extras = self._extras.get(key)
        if extras is None:
            extras = self._extras[key] = gradient_extras(self.graph, spec, feeds)
        return extras

    # --- forward mode (engine/forward) ------------------------------------------------------------
    def jvp(self, y: str, xs, tangents, zs=(), feeds: Mapping[str, object] | None = None, *, device="cpu",
            dtype=None, seed: int = 0, dims: Mapping[str, int] | None = None, past: int | None = None):
        """J·v: y's derivative along `tangents` (per x an array of its shape, "random" or "ones"; one
        word for all), in one forward pass. Feeds and defaults as for `gradient`. -> JVPResult."""
        from .forward.call import jvp

        return jvp(self, y, xs, tangents, zs, feeds, device=device, dtype=dtype, seed=seed, dims=dims, past=past)

    def hvp(self, y: str, xs, vs, zs=(), feeds: Mapping[str, object] | None = None, *, device="cpu",
            dtype=None, seed: int = 0, dims: Mapping[str, int] | None = None, past: int | None = None):
        """H·v for a scalar y, by forward over reverse: per x its block of the Hessian (w.r.t. all of
        xs) times the directions `vs` (as `jvp`'s tangents). -> HVPResult, with dy/dx too."""
        from .forward.call import hvp

        return hvp(self, y, xs, vs, zs, feeds, device=device, dtype=dtype, seed=seed, dims=dims, past=past)

    def prepare_jvp(self, y: str, xs, zs=(), *, device="cpu", dtype=None, extra_inputs: Sequence[str] = ()):
        """J·v compiled once: call with torch tensors (xs, zs, extras) and `tangents=[...]`."""
        return self._prepared_forward("jvp", y, xs, zs, device, dtype, extra_inputs)

    def prepare_hvp(self, y: str, xs, zs=(), *, device="cpu", dtype=None, extra_inputs: Sequence[str] = ()):
        """H·v compiled once: call with torch tensors (xs, zs, extras) and `vs=[...]`."""
        return self._prepared_forward("hvp", y, xs, zs, device, dtype, extra_inputs)

    def _prepared_forward(self, kind: str, y, xs, zs, device, dtype, extra_inputs):
        from .forward.prepared import PreparedHVP, PreparedJVP

        gradient = self.prepare_gradient(y, xs, zs, device=device, dtype=dtype, extra_inputs=extra_inputs,
                                         compile=False)
        key = (kind, gradient.spec, gradient.plan)
        prepared = self._forward.get(key)
        if prepared is None:
            prepared = self._forward[key] = (PreparedJVP if kind == "jvp" else PreparedHVP)(gradient.spec,
                                                                                            gradient.plan)
        return prepared

    # --- helpers ---------------------------------------------------------------------------------
    def compiled(self) -> "Model":
        """This model with `compile` on; it shares the loaded graph and every cache (keyed by mode)."""
        other = copy.copy(self)
        other.compile = True
        return other

    def check_feed_names(self, feeds: Mapping[str, object]) -> None:
        """FeedError for a feed that names no tensor of the model."""
        for n in feeds:
            if not self.graph.has_tensor(n):
                raise FeedError(f"feed {n!r} names no tensor in this model{self.graph.did_you_mean(n)}")

    def to_tensor(self, name: str, value, device: torch.device, float_dtype) -> torch.Tensor:
        """A feed as a tensor of the declared type on `device`; shape and dtype checked (`check_feed`)."""
        info = self.graph.types.get(name)
        if isinstance(value, (list, tuple)) and not (info and info.shape is not None):  # an ONNX sequence
            return [self.to_tensor(name + "[]", v, device, float_dtype) for v in value]
        if not isinstance(value, torch.Tensor):
            value = np.asarray(value)
        check_feed(self.graph, name, value)
        if isinstance(value, np.ndarray) and value.dtype.kind in "USO":
            return value.astype(object)  # strings stay numpy: only string ops read them
        if isinstance(value, torch.Tensor):
            t = value.to(device)
            if float_dtype is not None and t.is_floating_point():
                t = t.to(float_dtype)
        else:
            try:
                t = array_to_tensor(np.asarray(value), device, float_dtype,
                                    onnx_type=info.elem_type if info else None)
            except (TypeError, ValueError) as exc:
                raise FeedError(f"feed {name!r}: {exc}") from None
        if info is not None and info.elem_type is not None and float_dtype is None and t.is_floating_point():
            from .dtypes import FLOAT_ONNX_TYPES, onnx_to_torch

            if info.elem_type in FLOAT_ONNX_TYPES:
                t = t.to(onnx_to_torch(info.elem_type))
        return t

    def _to_numpy(self, name: str, t) -> np.ndarray:
        if isinstance(t, list):  # an ONNX sequence
            return [self._to_numpy(name, v) for v in t]
        arr = to_numpy(t)
        info = self.graph.types.get(name)
        if info is not None and info.elem_type:
            try:
                want = helper.tensor_dtype_to_np_dtype(info.elem_type)
            except Exception:
                return arr
            if arr.dtype != want and arr.dtype.kind in "iub" and np.dtype(want).kind in "iub":
                arr = arr.astype(want)
        return arr

    def _gradient_step(self, device, float_dtype):
        def make(node):  # a Gradient node inside the model: its own prepared gradient, as a step
            return self.prepare_gradient(*node_selection(node), device=device, dtype=float_dtype).node_step()

        return make
