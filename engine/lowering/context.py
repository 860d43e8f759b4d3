"""What a backward rule builds with: fresh names, constants, static shapes and shape-agnostic helpers.

Shapes and element types come from onnx shape inference over the model being lowered. A rule asks
`shape(t)` for a static shape (None when a dimension is unknown) and falls back to Shape/Expand
constructions that work for any shape.
"""
from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

from ..errors import LoweringError
from ..modelfile.reader import crashes_inference

HALF_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclass(frozen=True)
class TypeInfo:
    elem_type: int
    shape: tuple[int | None, ...] | None  # None: rank unknown; None entries: unknown dims


def collect_types(model: onnx.ModelProto) -> dict[str, TypeInfo]:
    """Element type and shape of every tensor that shape inference could type."""
    out: dict[str, TypeInfo] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.elem_type:
            continue
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        out[vi.name] = TypeInfo(tt.elem_type, shape)
    for t in g.initializer:
        out[t.name] = TypeInfo(t.data_type, tuple(t.dims))
    return out


def collect_constants(model: onnx.ModelProto, initializers=None) -> dict[str, np.ndarray]:
    """Values known without running the model: initializers that are not graph inputs (of
    `initializers` when given: those whose bytes are in the proto), Constant nodes."""
    g = model.graph
    inputs = {i.name for i in g.input}
    held = g.initializer if initializers is None else initializers
    out = {t.name: numpy_helper.to_array(t) for t in held if t.name not in inputs}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_ints", "value_int", "value_floats", "value_float"):
                    out[n.output[0]] = np.asarray(helper.get_attribute_value(a))
    return out


def known_values(model: onnx.ModelProto, weights=None) -> Mapping[str, np.ndarray]:
    """`collect_constants` over the initializers held in the proto, and the values of those whose bytes
    are outside it (`weights`, engine/modelfile/weights.py), read only when a rule asks for one."""
    g = model.graph
    detached = weights.detached() if weights is not None else frozenset()
    held = [t for t in g.initializer if t.name not in detached]
    if not detached:
        return collect_constants(model, held)
    inputs = {i.name for i in g.input}
    return ChainMap(collect_constants(model, held),
                    _Values(weights, {t.name for t in g.initializer} - inputs, detached))


class _Values(Mapping):
    """Values of the initializers whose bytes are outside the proto, read when a rule asks."""

    def __init__(self, weights, names: set[str], detached):
        self.weights, self.names = weights, names & set(detached)

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        return self.weights[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


# onnx's data propagation spells a 1-D tensor's values as one shape dimension each: a 1-D input of
# 2**31 elements (the >2 GB int8 table in tests/modelfile/test_large_models.py) made it allocate 24 GB
DATA_PROP_MAX_LENGTH = 1 << 16


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference, propagating Shape-derived values where it can (data_prop), which some
    function ops' inference does not survive: then without. Not with a long 1-D tensor declared."""
    if crashes_inference(model.graph):
        raise LoweringError("a node's attribute would crash onnx's shape inference (modelfile/reader.py: INFERENCE_HAZARDS)")
    if _declares_long_vector(model.graph):
        return onnx.shape_inference.infer_shapes(model)
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - the plain inference raises its own error if it must
        return onnx.shape_inference.infer_shapes(model)


def _declares_long_vector(g: onnx.GraphProto) -> bool:
    for t in g.initializer:
        if len(t.dims) == 1 and t.dims[0] > DATA_PROP_MAX_LENGTH:
            return True
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].dim_value > DATA_PROP_MAX_LENGTH:
            return True
    return False


def attr(node: NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            if isinstance(value, list):
                return [v.decode() if isinstance(v, bytes) else v for v in value]
            return value.decode() if isinstance(value, bytes) else value
    return default


class Ctx:
    """Builds the nodes of one backward graph; `nodes` collects them in creation order."""

    def __init__(self, types: dict[str, TypeInfo], constants: dict[str, np.ndarray], used: set[str],
                 prefix: str = "grad", opset: int = 17):
        self.opset = opset  # the model's ai.onnx opset: every node a rule adds must be valid at it
        self.types = types
        self.constants = constants
        self.used = used
        self.prefix = prefix
        self.nodes: list[NodeProto] = []
        self.wanted: tuple[bool, ...] = ()
        self.node: NodeProto | None = None  # the forward node whose rule is running

    def sub(self, prefix: str) -> "Ctx":
        """A context for a subgraph's nodes: its own node list, this model's names, types and opset."""
        return Ctx(self.types, self.constants, self.used, prefix, self.opset)

    def value_info(self, name: str, like: str) -> onnx.ValueInfoProto:
        """A subgraph input or output typed as `like` (unknown dimensions left open)."""
        info = self.types.get(like)
        shape = None if info is None or info.shape is None else info.shape
        return helper.make_tensor_value_info(name, self.elem(like), shape)

    # -- names and nodes ---------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = f"{self.prefix}/{hint}"
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def op(self, op_type: str, inputs, n: int = 1, **attrs):
        """Add a node; returns its output name (or list of names when n > 1)."""
        hint = op_type if self.node is None else f"{self.node.name or self.node.op_type}/{op_type}"
        outs = [self.fresh(hint) for _ in range(n)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"{hint}_node"), **attrs))
        return outs[0] if n == 1 else outs

    def emit(self, op_type: str, inputs, outputs, **attrs) -> None:
        """Add a node with given output names."""
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=self.fresh(f"{op_type}_node"),
                                           **attrs))

    def const(self, array: np.ndarray) -> str:
        name = self.fresh("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("const_node"),
                                           value=numpy_helper.from_array(np.asarray(array), name)))
        array = np.asarray(array)
        self.types[name] = TypeInfo(helper.np_dtype_to_tensor_dtype(array.dtype), tuple(array.shape))
        self.constants[name] = array
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def value_like(self, value, like: str) -> np.ndarray:
        return np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(self.elem(like)))

    def scalar(self, value: float, like: str) -> str:
        return self.const(np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(self.elem(like))))

    # -- what is known about a tensor ---------------------------------------------------------
    def wants(self, i: int) -> bool:
        return i < len(self.wanted) and self.wanted[i]

    def elem(self, t: str) -> int:
        info = self.types.get(t)
        return info.elem_type if info else TensorProto.FLOAT

    def rank(self, t: str) -> int | None:
        info = self.types.get(t)
        return None if info is None or info.shape is None else len(info.shape)

    def shape(self, t: str) -> tuple[int, ...] | None:
        info = self.types.get(t)
        if info is None or info.shape is None or any(d is None for d in info.shape):
            return None
        return tuple(info.shape)

    def need_rank(self, t: str) -> int:
        r = self.rank(t)
        if r is None:
            raise self.error(f"needs the rank of {t!r}, which shape inference could not find")
        return r

    def need_shape(self, t: str) -> tuple[int, ...]:
        s = self.shape(t)
        if s is None:
            raise self.error(f"needs the static shape of {t!r}, which shape inference could not find")
        return s

    def value(self, t: str) -> np.ndarray | None:
        return self.constants.get(t) if t else None

    def need_value(self, t: str) -> np.ndarray:
        v = self.value(t)
        if v is None:
            raise self.error(f"needs {t!r} to be a constant (an initializer or a Constant node)")
        return v

    def error(self, why: str) -> LoweringError:
        n = self.node
        where = f"node {n.name or '(unnamed)'!r} ({n.op_type})" if n is not None else "lowering"
        return LoweringError(f"cannot lower {where}: {why}")

    def infer(self, nodes: list[NodeProto], inputs: list[str]) -> None:
        """Type the outputs of `nodes` (a decomposition built by a rule) with onnx shape inference; every
        tensor they read and do not compute (an input of the rule's node, or one a body reads from its
        enclosing graph) is declared with what is known of it."""
        produced = {o for n in nodes for o in n.output}
        inputs = list(dict.fromkeys(list(inputs) + [t for n in nodes for t in n.input if t and t not in produced]))
        declared, known = [], []
        for t in inputs:
            value = self.constants.get(t)
            if value is not None and value.size <= 64:  # small constants (axes, shapes) by value
                known.append(numpy_helper.from_array(np.asarray(value), t))
                continue
            info = self.types.get(t)
            declared.append(helper.make_tensor_value_info(t, self.elem(t), None if info is None else info.shape))
        graph = helper.make_graph(nodes, "decomposition", declared, [], known)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        self.constants.update(collect_constants(model))  # a function body's Constant nodes, e.g. its axes
        inferred = infer_shapes(model)
        self.types.update({k: v for k, v in collect_types(inferred).items() if k not in inputs})

    # -- shape-agnostic helpers ---------------------------------------------------------------
    def tensor_like(self, value: float, like: str):
        """A one-element TensorProto in like's element type (ConstantOfShape's value)."""
        return numpy_helper.from_array(np.asarray([value], dtype=helper.tensor_dtype_to_np_dtype(self.elem(like))))

    def fill_like(self, t: str, value: float) -> str:
        return self.op("ConstantOfShape", [self.op("Shape", [t])], value=self.tensor_like(value, t))

    def add_all(self, terms: list[str]) -> str | None:
        if not terms:
            return None
        if len(terms) == 1:
            return terms[0]
        return self.op("Add", terms) if len(terms) == 2 else self.op("Sum", terms)

    def reduce(self, op_type: str, t: str, axes, keepdims: int = 1) -> str:
        """A Reduce* node over constant axes, written as the model's opset wants them: an input from
        opset 18 (from 13 for ReduceSum), an attribute before."""
        axes = [int(a) for a in axes]
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [t, self.ints(axes)], keepdims=keepdims)
        return self.op(op_type, [t], axes=axes, keepdims=keepdims)

    def reduce_sum(self, g: str, axes, keepdims: int = 1) -> str:
        axes = list(axes)
        if not axes:
            return g
        return self.op("ReduceSum", [g, self.ints(axes)], keepdims=keepdims)

    def per_count(self, big: str, small: str) -> str:
        """1 / (size(big) / size(small)) in big's float type, one over how many inputs a mean averaged over; taken
        in float64 first: a mean over more than 65504 inputs divides by infinity in float16, where its
        reciprocal is still a (subnormal) number."""
        sb, ss = self.shape(big), self.shape(small)
        if sb is not None and ss is not None:
            return self.scalar(1.0 / max(1, np.prod(sb, dtype=np.int64) // max(1, np.prod(ss, dtype=np.int64))), big)
        ratio = self.op("Cast", [self.op("Div", [self.op("Size", [big]), self.op("Size", [small])])], to=TensorProto.DOUBLE)
        return self.op("Cast", [self.op("Reciprocal", [ratio])], to=self.elem(big))

    def wide_type(self, like: str) -> int:
        """float32 for a half type, else like's own: torch takes the intermediates of many backward formulas
        in float32 (its opmath), and so must their lowering where a half intermediate would overflow."""
        return TensorProto.FLOAT if self.elem(like) in HALF_TYPES else self.elem(like)

    def cast(self, t: str, to: int) -> str:
        """t cast to `to` (t itself where its type is known to be `to`), typed so that later scalars take `to`."""
        info = self.types.get(t)
        if info is not None and info.elem_type == to:
            return t
        out = self.op("Cast", [t], to=to)
        self.types[out] = TypeInfo(to, None if info is None else info.shape)
        return out

    def widened(self, t: str) -> str:
        """t (of a known type) in wide_type."""
        return self.cast(t, self.wide_type(t))

    def narrowed(self, t: str, like: str) -> str:
        """t (of float32 after `widened`) back in like's element type."""
        return self.op("Cast", [t], to=self.elem(like)) if self.elem(like) in HALF_TYPES else t

    def unbroadcast(self, g: str, x: str, out: str) -> str:
        """Sum g (shaped like `out`) over the axes along which x was broadcast, back to x's shape."""
        sx, so = self.shape(x), self.shape(out)
        if sx is not None and so is not None:
            if sx == so:
                return g
            lead = len(so) - len(sx)
            axes = list(range(lead)) + [lead + i for i, d in enumerate(sx) if d == 1 and so[lead + i] != 1]
            g = self.reduce_sum(g, axes)
            return g if lead == 0 else self.op("Reshape", [g, self.ints(sx)])
        # shapes only known at run time: x's shape left-padded with ones to out's rank, compared with out's
        shape_x, shape_out = self.op("Shape", [x]), self.op("Shape", [out])
        lead = self.op("Sub", [self.op("Shape", [shape_out]), self.op("Shape", [shape_x])])
        ones = self.op("ConstantOfShape", [lead], value=numpy_helper.from_array(np.ones(1, np.int64)))
        padded = self.op("Concat", [ones, shape_x], axis=0)
        differs = self.op("Not", [self.op("Equal", [padded, shape_out])])
        axes = self.op("Reshape", [self.op("NonZero", [differs]), self.ints([-1])])
        g = self.op("ReduceSum", [g, axes], keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", [g, shape_x])

    def dims(self, t: str, start: int, stop: int | None = None) -> str:
        """t's dimensions start:stop as a 1-D int64 tensor: a constant where known, else a Shape slice."""
        shape = self.shape(t)
        if shape is not None:
            return self.ints(shape[start:stop])
        return self.op("Slice", [self.op("Shape", [t]), self.ints([start]), self.ints([2**62 if stop is None else stop])])

    def shape_from(self, parts) -> str:
        """A 1-D int64 shape from parts: ints (constants) and 1-D int64 tensor names, concatenated."""
        names = [self.ints([p]) if isinstance(p, (int, np.integer)) else p for p in parts]
        return names[0] if len(names) == 1 else self.op("Concat", names, axis=0)

    def positions(self, t: str) -> str:
        """An int64 tensor shaped like t holding each element's flat position: applying a gather-like op
        to it says where each output element came from."""
        shape = self.op("Shape", [t])
        size = self.op("ReduceProd", [shape], keepdims=0)  # not Size(t): onnxruntime has no Size for every type
        flat = self.op("Range", [self.const(np.asarray(0, np.int64)), size, self.const(np.asarray(1, np.int64))])
        return self.op("Reshape", [flat, shape])

    def scatter_back(self, g: str, x: str, positions: str) -> str:
        """The gradient of a gather-like op: g added up at the flat positions of x its elements came from."""
        flat = self.ints([-1])
        size = self.op("ReduceProd", [self.op("Shape", [x])], keepdims=1)
        added = self.scatter_add("ScatterElements", size, self.op("Reshape", [positions, flat]),
                                 self.op("Reshape", [g, flat]), x, axis=0)
        return self.op("Reshape", [added, self.op("Shape", [x])])

    def scatter_add(self, op_type: str, shape: str, indices: str, updates: str, like: str, **attrs) -> str:
        """Zeros of `shape` (a 1-D shape tensor) in like's element type with `updates` added at `indices`
        (ScatterElements / ScatterND); half types add in float32, which onnxruntime's CPU kernels need."""
        elem = self.elem(like)
        half = elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        work = TensorProto.FLOAT if half else elem
        zeros = self.op("ConstantOfShape", [shape], value=numpy_helper.from_array(
            np.zeros(1, helper.tensor_dtype_to_np_dtype(work))))
        if half:
            updates = self.op("Cast", [updates], to=work)
        added = self.op(op_type, [zeros, indices, updates], reduction="add", **attrs)
        return self.op("Cast", [added], to=elem) if half else added
