"""Random graphs from NNSmith (github.com/ise-uiuc/nnsmith), whose own torch module is an oracle for
onnxgrad's gradients: NNSmith draws a graph from its own operator specs, builds it as a torch module
(`SymbolNet`) and exports that with torch's TorchScript exporter, so the torch program shares no code with engine/.

Names: SymbolNet's `input_like` / `output_like` keys (NNSmith's IR variables, "v3_0") are the ONNX
graph's input and output names (NNSmith hands them to the exporter), its `state_dict()` keys
("mlist.2.weight"; "mlist.0.data" for a constant) are the initializers' names, and
`forward(**inputs)` returns the outputs in `output_like` order. NNSmith is imported lazily.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import io
import logging
import random
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np
import onnx
import torch

FLOAT_TYPES = {onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE}
PRECISION = ["float16", "float32", "float64"]

# nnsmith op class -> the ONNX op type of the one node its float inputs and output are (in order); the exporter's other
# nodes for it compute only constant shapes, axes, pads, sizes or clip bounds. Measured by exporting each op of 150
# generated graphs alone (torch 2.13's TorchScript exporter, opset 14). Left out: GELU (Div, Erf, Add, Mul, Mul: no Gelu
# in opset 14), Linear (Transpose, MatMul, Add), PReLU (its slope reaches PRelu reshaped by Squeeze/Unsqueeze), Flatten
# (Shape, Slice, Concat, Reshape; Identity for a 1-d input), the ops without a float output. Per instance (`_onnx_type`):
# a Slice keeping its whole axis exports as Identity, a Cast to its input's type as nothing; the exporter also merges
# equal ops on one input, nested Concats on one axis and drops no-op Squeezes (mutate_torch_module refuses those graphs).
# Binary ops on two 0-d float64 tensors get Casts to float32 in front (the exporter's scalar rule), so run in float32.
ONNX_OP_TYPE = {op: onnx_type for onnx_type, ops in {
    "Relu": "ReLU", "LeakyRelu": "LeakyReLU", "MaxPool": "MaxPool2d", "AveragePool": "AvgPool2d",
    "BatchNormalization": "BatchNorm2d", "Conv": "Conv1d NCHWConv2d", "Pad": "ConstPad ReflectPad ReplicatePad",
    "Expand": "ExpandLast1 ExpandLast2 ExpandLast3 ExpandLast4", "Concat": "Concat1 Concat2 Concat3 Concat4 Concat5",
    "Resize": "NearestInterp LinearInterp BilinearInterp BicubicInterp TrilinearInterp", "Trilu": "Tril Triu",
    "ReduceSum": "TorchReduceSum", "Cast": "CastF32 CastF64", "MatMul": "PTMatMul",
    **{same: same for same in ("Sigmoid Sin Cos Tan Atan Abs Neg Floor Ceil Round Add Sub Mul Div Max Min Where Clip "
                               "Softmax Slice Reshape Transpose Squeeze ReduceMin ReduceMax ReduceMean").split()},
}.items() for op in ops.split()}

# While set, the module's float Casts cast to this dtype: onnxgrad's dtype="float64" promotes Cast
# targets too, and the oracle must compute the same function.
_PROMOTE: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("nnsmith_promote", default=None)


def _cast(x: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    return x.to(_PROMOTE.get() or target)


def available() -> bool:
    return importlib.util.find_spec("nnsmith") is not None and importlib.util.find_spec("z3") is not None


@dataclass(frozen=True, eq=False)
class RandomGraph:
    seed: int
    onnx: bytes  # the serialized ModelProto
    module: torch.nn.Module  # nnsmith's SymbolNet, in eval mode
    feeds: dict[str, np.ndarray]  # every graph input, by its ONNX name
    outputs: tuple[str, ...]
    dtype: str  # its least precise float type, which bounds a native run's precision
    expected: dict[str, np.ndarray] = field(repr=False)  # nnsmith's oracle: the module's outputs at feeds
    ops: tuple[str, ...] = ()  # the nnsmith op class of each instruction
    onnx_op_types: tuple[str, ...] = ()  # each ONNX node's

    @property
    def proto(self) -> onnx.ModelProto:
        return onnx.load_from_string(self.onnx)


@functools.cache
def _nnsmith() -> types.SimpleNamespace:
    """Set up once per process: nnsmith narrows its op specs to what exports (cached in ~/.cache)."""
    with _generating(0):
        from nnsmith.abstract.dtype import DType
        from nnsmith.abstract.extension import activate_ext
        from nnsmith.graph_gen import model_gen
        from nnsmith.materialize import Model
        from nnsmith.materialize.torch.input_gen import SamplingSearch
        from nnsmith.narrow_spec import auto_opset

        model_type = Model.init("onnx", backend_target="cpu")
        opset = auto_opset(model_type, None)
        activate_ext(opset=opset, factory=None)
    for op in opset:  # nnsmith lists them in set order (hash-seeded) when it infers them; the same seed must give one graph
        op.in_dtypes, op.out_dtypes = (sorted(ds, key=lambda t: [d.name for d in t]) for ds in (op.in_dtypes, op.out_dtypes))
    return types.SimpleNamespace(DType=DType, model_gen=model_gen, model_type=model_type, opset=opset, search=SamplingSearch)


@contextlib.contextmanager
def _generating(seed: int) -> Iterator[None]:
    """Quiet, seeded, and leaving the process as it was: nnsmith seeds the global random and numpy
    states, torch's draws weights, z3 gets a fresh context (in one earlier graphs filled, the same seed
    solves to other shapes), and nnsmith's torch2onnx gets the TorchScript exporter (torch >= 2.9: dynamo)."""
    import z3

    saved = random.getstate(), np.random.get_state(), z3.z3._main_ctx, torch.onnx.export, logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    z3.z3._main_ctx = None  # main_ctx() makes a new one on first use
    torch.onnx.export = functools.partial(saved[3], dynamo=False)
    try:
        with (torch.random.fork_rng(devices=[]), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()),
              contextlib.redirect_stderr(io.StringIO())):
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        z3.z3._main_ctx, torch.onnx.export = saved[2:4]
        logging.disable(saved[4])


def generate(seed: int, dtypes=("float32", "float64"), max_nodes: int = 10) -> RandomGraph | None:
    """The random graph of `seed` (the same bytes every time), or None where nnsmith fails for it."""
    ns = _nnsmith()
    with _generating(seed):
        try:
            gen = ns.model_gen(opset=ns.opset, method="symbolic-cinit", seed=seed, max_elem_per_tensor=2**10,
                               max_nodes=max_nodes, timeout_ms=10000, dtype_choices=[ns.DType[d] for d in dtypes])
            model = ns.model_type.from_gir(gen.make_concrete())
            net = model.torch_model
            # nnsmith's refine_weights runs Adam for 20 ms of wall time, so its weights would depend
            # on the machine's speed; a fixed number of samples does not.
            _, model.sat_inputs = ns.search(net).search(max_time_ms=None, max_sample=3)
            net.check_intermediate_numeric = False
            if model.sat_inputs is None:  # every sample gave NaN or Inf somewhere
                return None
            proto = model.get_onnx_from_torch()
            oracle = model.make_oracle()
        except Exception:  # nnsmith's constraint, solver and exporter failures alike
            return None
    if [i.name for i in proto.graph.input] + [o.name for o in proto.graph.output] != [*net.input_like, *net.output_like]:
        return None  # the name mapping everything here relies on does not hold
    for i, (_, args, outs, op) in enumerate(net.instructions):
        target = getattr(op, "extra_attrs", {}).get("to")
        if type(op).__name__.startswith("Cast") and target is not None and target.torch().is_floating_point:
            net.instructions[i] = (functools.partial(_cast, target=target.torch()), args, outs, op)
    g = proto.graph  # the ONNX model's types, not the IR's: the exporter casts some 0-d float64 ops to float32
    types_ = [v.type.tensor_type.elem_type for v in [*g.input, *g.output]] + [t.data_type for t in g.initializer]
    types_ += [a.i for n in g.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    floats = {onnx.helper.tensor_dtype_to_np_dtype(t).name for t in types_ if t in FLOAT_TYPES}
    return RandomGraph(seed=seed, onnx=proto.SerializeToString(), module=net.eval(), feeds=dict(oracle.input),
                       outputs=tuple(net.output_like), dtype=min(floats, key=PRECISION.index, default="float64"),
                       expected=dict(oracle.output), ops=tuple(type(inst[3]).__name__ for inst in net.instructions),
                       onnx_op_types=tuple(n.op_type for n in g.node))


def selections(graph: RandomGraph) -> list[tuple[str, list[str], list[str]]]:
    """(y, xs, zs) per float output y: xs the float graph inputs and weights (initializers that are module
    parameters; torch will not differentiate BatchNorm's running statistics) y reads, zs the other inputs."""
    g = graph.proto.graph
    producer = {o: n for n in g.node for o in n.output}
    params = {n for n, p in graph.module.named_parameters() if p.is_floating_point()}
    candidates = [i.name for i in g.input if i.type.tensor_type.elem_type in FLOAT_TYPES]
    candidates += [t.name for t in g.initializer if t.data_type in FLOAT_TYPES and t.name in params]
    # an If's branches read outer names too (the exporter makes one for some Squeezes)
    reads = lambda node: [*node.input, *(i for a in node.attribute for b in [a.g, *a.graphs] for n in b.node for i in n.input)]
    out = []
    for o in g.output:
        seen = _closure(o.name, lambda t: reads(producer[t]) if t in producer else ())
        xs = [n for n in candidates if n in seen]
        if xs and o.type.tensor_type.elem_type in FLOAT_TYPES:
            out.append((o.name, xs, [i.name for i in g.input if i.name not in xs]))
    return out


def torch_function(graph: RandomGraph, y: str, xs, dtype=torch.float64) -> Callable[..., torch.Tensor]:
    """y as a torch function of xs (graph inputs or initializers), everything else at the graph's
    feeds and weights, every float tensor and Cast target in `dtype` (what onnxgrad's dtype="float64"
    differentiates). For torch.autograd.gradcheck too."""
    net = graph.module.eval()
    state = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in net.state_dict().items()}
    feeds = {k: torch.from_numpy(np.array(v)) for k, v in graph.feeds.items()}
    feeds = {k: v.to(dtype) if v.is_floating_point() else v for k, v in feeds.items()}
    if any(x not in feeds and x not in state for x in xs):  # functional_call would ignore it
        raise KeyError(f"{[x for x in xs if x not in feeds and x not in state]} not in seed {graph.seed}'s graph")

    def f(*values: torch.Tensor) -> torch.Tensor:
        inputs, params = dict(feeds), dict(state)
        for x, v in zip(xs, values):
            (inputs if x in feeds else params)[x] = v
        token = _PROMOTE.set(dtype)
        try:
            return torch.func.functional_call(net, params, args=(), kwargs=inputs)[graph.outputs.index(y)]
        finally:
            _PROMOTE.reset(token)

    return f


def torch_values(graph: RandomGraph, xs, dtype=torch.float64) -> list[torch.Tensor]:
    state = graph.module.state_dict()
    return [(torch.from_numpy(np.array(graph.feeds[x])) if x in graph.feeds else state[x].detach()).to(dtype) for x in xs]


def torch_gradient(graph: RandomGraph, y: str, xs, dy=None, dtype=torch.float64) -> dict[str, np.ndarray]:
    """dy/dx by torch.autograd through nnsmith's module, in `dtype` (dy: ones when None)."""
    values = [v.requires_grad_() for v in torch_values(graph, xs, dtype)]
    out = torch_function(graph, y, xs, dtype)(*values)
    seed = torch.ones_like(out) if dy is None else torch.as_tensor(np.asarray(dy)).to(out.dtype).reshape(out.shape)
    grads = torch.autograd.grad(out, values, seed, allow_unused=True) if out.requires_grad else [None] * len(values)
    return {x: (torch.zeros_like(v) if g is None else g).detach().numpy() for x, v, g in zip(xs, values, grads)}


def _onnx_type(op) -> str | None:
    kind = ONNX_OP_TYPE.get(type(op).__name__)
    if kind == "Slice" and list(op.input_like[0].shape) == list(op.output_like[0].shape):
        return None
    source = op.input_like[0].dtype if kind == "Cast" else None
    if source is not None and (source == op.extra_attrs["to"] or not source.torch().is_floating_point):
        return None
    return kind


class _Swapped(torch.autograd.Function):
    """The op's own forward; its backward is `mutate` of the op's true VJPs."""

    @staticmethod
    def forward(ctx, run, mutate, *args):
        ctx.run, ctx.mutate = run, mutate
        ctx.save_for_backward(*args)
        out = run(*args)
        # a copy: an input's view (Reshape, Slice, Expand) returned by a Function is tracked as a view
        return tuple(o.clone() for o in out) if isinstance(out, (list, tuple)) else out.clone()

    @staticmethod
    def backward(ctx, *grads):
        args = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
            outs = ctx.run(*leaves)
            outs = tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)
            diff = [a for a in leaves if a.requires_grad]
            true = iter(torch.autograd.grad(outs, diff, grads, allow_unused=True) if diff else ())
        true_vjps = [next(true) if a.requires_grad else None for a in leaves]
        true_vjps = tuple(torch.zeros_like(a) if a.requires_grad and g is None else g for a, g in zip(leaves, true_vjps))
        return (None, None, *ctx.mutate(true_vjps, grads, tuple(args), tuple(o.detach() for o in outs)))


def _swapped(fn, mutate) -> Callable:
    if not isinstance(fn, torch.nn.Module):
        return lambda *inputs: _Swapped.apply(fn, mutate, *inputs)
    # Weights (and BatchNorm's running statistics) become the Function's inputs after the op's own,
    # in the ONNX node's input order (Conv: X, W, B; BatchNormalization: X, scale, B, mean, var).
    names = [n for n, _ in fn.named_parameters()] + [n for n, b in fn.named_buffers() if b.is_floating_point()]

    def run(*args):
        k = len(args) - len(names)
        return torch.func.functional_call(fn, dict(zip(names, args[k:])), args=tuple(args[:k]))

    # getattr, not get_parameter: inside torch_function's functional_call the weights are plain tensors
    return lambda *inputs: _Swapped.apply(run, mutate, *inputs, *[getattr(fn, n) for n in names])


@contextlib.contextmanager
def mutate_torch_module(graph: RandomGraph, onnx_op_type: str, mutate) -> Iterator[int]:
    """Inside, every instruction of the module that exports to an `onnx_op_type` node (ONNX_OP_TYPE)
    has the backward mutate(true_vjps, grads, inputs, outputs) -> one gradient per input (None for
    a non-float one); true_vjps has an entry per input, None where not float. An nn op's inputs
    include its weights, in the ONNX node's order. Yields how many instructions were swapped."""
    chosen = [i for i, inst in enumerate(graph.module.instructions) if _onnx_type(inst[3]) == onnx_op_type]
    if len(chosen) > graph.onnx_op_types.count(onnx_op_type):
        raise ValueError(f"seed {graph.seed}: {len(chosen)} ops export to fewer {onnx_op_type} nodes: merged or dropped")
    with _replaced(graph.module, {i: _swapped(graph.module.instructions[i][0], mutate) for i in chosen}):
        yield len(chosen)


# Kinks, where nnsmith's module and onnxgrad may take different valid subgradients: nnsmith's ReduceMax is x.max(dim)
# (all the gradient to one tied element), onnxgrad's amax splits it; ties, ReLU/Abs at 0, Clip at a bound: spec's open.
def _reduce_tie(fn, op, x, out):
    d = op.extra_attrs["reduce_dim"]
    return bool(((x == out).sum() if d is None else (x == out.unsqueeze(d)).sum(d)).gt(1).any())


def _pool_tie(fn, op, x, out):
    p, (kh, kw) = fn.padding, fn.kernel_size
    cols = torch.nn.functional.unfold(torch.nn.functional.pad(x, [p] * 4, value=-torch.inf), (kh, kw), stride=fn.stride)
    cols = cols.reshape(x.shape[0], x.shape[1], kh * kw, -1)
    return bool((cols == cols.amax(2, keepdim=True)).sum(2).gt(1).any())


KINKS = {**dict.fromkeys(["ReLU", "LeakyReLU", "PReLU", "Abs"], lambda fn, op, x, out: bool((x == 0).any())),
         **dict.fromkeys(["Max", "Min"], lambda fn, op, a, b, out: bool((a == b).any())),
         "Clip": lambda fn, op, x, out: bool((x.abs() == 1.5).any()),  # nnsmith clips floats to [-1.5, 1.5]
         "ReduceMax": _reduce_tie, "ReduceMin": _reduce_tie, "MaxPool2d": _pool_tie}


def kinks(graph: RandomGraph, dtype=torch.float64) -> dict[str, tuple[str, ...]]:
    """Output -> the ops above it evaluated at a kink (KINKS), in `dtype` at the graph's feeds."""
    net, found = graph.module, {}

    def recording(i, fn, op, test):
        def run(*inputs):
            out = fn(*inputs)
            if inputs[0].is_floating_point() and test(fn, op, *inputs, out):
                found[i] = type(op).__name__
            return out
        return run

    with _replaced(net, {i: recording(i, fn, op, KINKS[type(op).__name__]) for i, (fn, _, _, op) in enumerate(net.instructions)
                         if type(op).__name__ in KINKS}), torch.no_grad():
        torch_function(graph, graph.outputs[0], [], dtype)()
    producer, out = {o: i for i, inst in enumerate(net.instructions) for o in inst[2]}, {}
    for y in graph.outputs:
        above = {producer[v] for v in _closure(y, lambda v: net.instructions[producer[v]][1] if v in producer else ())
                 if v in producer}
        if above & set(found):
            out[y] = tuple(found[i] for i in sorted(above & set(found)))
    return out


def _closure(start: str, parents: Callable[[str], Iterable[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(parents(t))
    return seen


@contextlib.contextmanager
def _replaced(net, fns: dict[int, Callable]) -> Iterator[None]:
    saved = list(net.instructions)
    for i, fn in fns.items():
        net.instructions[i] = (fn, *saved[i][1:])
    try:
        yield
    finally:
        net.instructions[:] = saved


# torch's float32 gradient minus its float64 one, times float64's roundoff over float32's, estimates the float64
# gradient's own roundoff: where a gradient cancels to ~0 (Softmax along a shift, x / |x|) that is all there is.
F64_OVER_F32 = 2.0**-29
ROUNDOFF_ALLOWANCE = 1000.0


@dataclass(frozen=True)
class Comparison:
    """onnxgrad's gradients against torch's, per (y, x): relative L2 error ‖e − t‖ / max(‖e‖, ‖t‖)."""

    errors: dict[tuple[str, str], float]
    allowed: dict[tuple[str, str], float]  # tol + ROUNDOFF_ALLOWANCE × torch's estimated roundoff / scale
    nonfinite: tuple[tuple[str, str], ...] = ()  # torch's gradient has NaN or Inf: no verdict
    kinked: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # disagree, y above a kink: no verdict
    zero: tuple[tuple[str, str], ...] = ()  # both exactly zero (a Floor or a saturated Clip above x): vacuous

    @property
    def failures(self) -> dict[tuple[str, str], float]:
        return {k: e for k, e in self.errors.items() if k not in self.nonfinite and k not in self.kinked
                and not e <= self.allowed[k]}


def random_dy(graph: RandomGraph, y: str) -> np.ndarray:  # float64, seeded by the graph's seed and y
    return np.random.default_rng([graph.seed, graph.outputs.index(y)]).standard_normal(graph.expected[y].shape)


def engine_gradient_matches_torch(graph: RandomGraph, tol: float = 1e-6) -> Comparison:
    """onnxgrad's float64 gradient of every selection against torch's, with the same random dy."""
    import engine

    model = engine.load(graph.onnx)
    at_kinks = kinks(graph)
    errors, allowed, nonfinite, kinked, zero = {}, {}, [], {}, []
    for y, xs, zs in selections(graph):
        dy = random_dy(graph, y)
        want, want32 = torch_gradient(graph, y, xs, dy), torch_gradient(graph, y, xs, dy, dtype=torch.float32)
        got = model.gradient(y, xs, zs, dict(graph.feeds), dy=dy, dtype="float64").grads
        for x in xs:
            k, e = (y, x), np.asarray(got[x], dtype=np.float64) if x in got else None
            errors[k] = relative_l2(e, want[x])
            scale = max(np.linalg.norm(want[x]), np.linalg.norm(e) if e is not None else 0.0)
            roundoff = np.nan_to_num(np.linalg.norm(want32[x].astype(np.float64) - want[x]) * F64_OVER_F32, posinf=0.0)
            allowed[k] = tol + (ROUNDOFF_ALLOWANCE * roundoff / scale if scale else 0.0)
            if not np.isfinite(want[x]).all():
                nonfinite.append(k)
            elif not errors[k] <= allowed[k] and y in at_kinks:
                kinked[k] = at_kinks[y]
            elif not want[x].any() and errors[k] == 0:
                zero.append(k)
    return Comparison(errors, allowed, tuple(nonfinite), kinked, tuple(zero))


def relative_l2(got, want: np.ndarray) -> float:
    if got is None or np.shape(got) != want.shape:
        return float("inf")
    got = np.asarray(got, dtype=np.float64)
    scale = max(np.linalg.norm(got), np.linalg.norm(want))
    return 0.0 if scale == 0 else float(np.linalg.norm(got - want) / scale)
