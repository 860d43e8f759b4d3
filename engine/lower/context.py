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
    are outside it (`weights`, engine/weights.py), read only when a rule asks for one."""
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
                 prefix: str = "grad"):
        self.types = types
        self.constants = constants
        self.used = used
        self.prefix = prefix
        self.nodes: list[NodeProto] = []
        self.wanted: tuple[bool, ...] = ()
        self.node: NodeProto | None = None  # the forward node whose rule is running

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

    def infer(self, nodes: list[NodeProto], inputs: list[str], opset: int = 17) -> None:
        """Type the outputs of `nodes` (a decomposition built by a rule) with onnx shape inference."""
        declared = []
        for t in inputs:
            info = self.types.get(t)
            declared.append(helper.make_tensor_value_info(t, self.elem(t), None if info is None else info.shape))
        graph = helper.make_graph(nodes, "decomposition", declared, [])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        self.types.update({k: v for k, v in collect_types(onnx.shape_inference.infer_shapes(model)).items()
                           if k not in inputs})

    # -- shape-agnostic helpers ---------------------------------------------------------------
    def fill_like(self, t: str, value: float) -> str:
        fill = numpy_helper.from_array(np.asarray([value], dtype=helper.tensor_dtype_to_np_dtype(self.elem(t))))
        return self.op("ConstantOfShape", [self.op("Shape", [t])], value=fill)

    def add_all(self, terms: list[str]) -> str | None:
        if not terms:
            return None
        if len(terms) == 1:
            return terms[0]
        return self.op("Add", terms) if len(terms) == 2 else self.op("Sum", terms)

    def reduce_sum(self, g: str, axes, keepdims: int = 1) -> str:
        axes = list(axes)
        if not axes:
            return g
        return self.op("ReduceSum", [g, self.ints(axes)], keepdims=keepdims)

    def count_ratio(self, big: str, small: str) -> str:
        """size(big) / size(small) in big's float type: how many inputs a mean averaged over."""
        sb, ss = self.shape(big), self.shape(small)
        if sb is not None and ss is not None:
            return self.scalar(float(np.prod(sb, dtype=np.int64) // max(1, np.prod(ss, dtype=np.int64))), big)
        ratio = self.op("Div", [self.op("Size", [big]), self.op("Size", [small])])
        return self.op("Cast", [ratio], to=self.elem(big))

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
        rx, ro = self.need_rank(x), self.need_rank(out)
        padded = self.op("Shape", [x])
        if ro > rx:
            padded = self.op("Concat", [self.ints([1] * (ro - rx)), padded], axis=0)
        differs = self.op("Not", [self.op("Equal", [padded, self.op("Shape", [out])])])
        axes = self.op("Reshape", [self.op("NonZero", [differs]), self.ints([-1])])
        g = self.op("ReduceSum", [g, axes], keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", [g, self.op("Shape", [x])])
