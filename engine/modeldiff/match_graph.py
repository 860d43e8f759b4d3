"""What the matcher asks of one graph: which nodes only carry a value along (a converter's Casts, a
quantizer's QuantizeLinear→DequantizeLinear pairs), which tensors are constants, and whether two nodes'
attributes or two constants can stand for each other. Torch-free."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, TensorProto, helper, numpy_helper

from ..modelfile.index import GraphIndex

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})
_STANDARD = ("", "ai.onnx")


def _attr(node: NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def is_carrier(g: GraphIndex, i: int) -> bool:
    """A node that hands its input's value on (in another precision, or quantized and back): a float Cast,
    a DequantizeLinear of a QuantizeLinear's output, an Identity, a Dropout, a Mul or Div by a single 1."""
    node = g.nodes[i]
    if node.domain not in _STANDARD and node.domain != "com.microsoft":
        return False
    if node.op_type == "Cast":
        return _attr(node, "to") in FLOAT_TYPES
    if node.op_type == "Identity" or (node.op_type == "Dropout" and not (len(node.output) > 1 and node.output[1])):
        return True  # Dropout without its mask is the identity in inference
    if node.op_type in ("Mul", "Div") and len(node.input) == 2:
        return _all_equal(g, node.input[1], 1.0)  # exporters' Div by 1, which optimizers remove
    if node.op_type == "DequantizeLinear":
        q = g.producer.get(node.input[0])
        return q is not None and g.nodes[q].op_type == "QuantizeLinear"
    return False


def _all_equal(g: GraphIndex, t: str, value: float) -> bool:
    shape = constant_shape(g, t)
    if shape is None or int(np.prod(shape[0], dtype=np.int64)) != 1:
        return False
    v = constant_value(g, t)
    return v is not None and v.size > 0 and bool(np.all(v == value))


def source(g: GraphIndex, t: str) -> str:
    """The tensor whose value `t` carries: `t` itself unless carrier nodes produce it."""
    while t:
        i = g.producer.get(t)
        if i is None or not is_carrier(g, i):
            return t
        node = g.nodes[i]
        t = g.nodes[g.producer[node.input[0]]].input[0] if node.op_type == "DequantizeLinear" else node.input[0]
    return t


def constant_kind(g: GraphIndex, t: str) -> str | None:
    """'init' (an initializer), 'dq' (a dequantized initializer: a quantizer's weight) or 'const' (a Constant
    node's output); None for computed values and graph inputs."""
    if t in g.initializers:
        return "init"
    i = g.producer.get(t)
    if i is None:
        return None
    node = g.nodes[i]
    if node.op_type == "Constant" and node.domain in _STANDARD:
        return "const"
    if node.op_type == "DequantizeLinear" and node.input[0] in g.initializers:
        return "dq"
    return None


def constant_shape(g: GraphIndex, t: str) -> tuple[tuple[int, ...], int] | None:
    """(dims, elem_type) of a constant; the DequantizeLinear's quantized input gives a 'dq' tensor's dims."""
    kind = constant_kind(g, t)
    if kind == "init":
        p = g.initializers[t]
        return tuple(p.dims), p.data_type
    if kind == "dq":
        p = g.initializers[g.nodes[g.producer[t]].input[0]]
        return tuple(p.dims), TensorProto.FLOAT
    if kind == "const":
        v = _attr(g.nodes[g.producer[t]], "value")
        if isinstance(v, TensorProto):
            return tuple(v.dims), v.data_type
    return None


def types_compatible(x: int, y: int) -> bool:
    """The same dtype, or two float dtypes (a cast model converts float32 weights to float16)."""
    return x == y or (x in FLOAT_TYPES and y in FLOAT_TYPES)


def constants_compatible(a: GraphIndex, ta: str, b: GraphIndex, tb: str) -> bool:
    sa, sb = constant_shape(a, ta), constant_shape(b, tb)
    if sa is None or sb is None:
        return constant_kind(a, ta) == constant_kind(b, tb) == "const"  # non-tensor Constant values
    return sa[0] == sb[0] and types_compatible(sa[1], sb[1])


def constant_value(g: GraphIndex, t: str) -> np.ndarray | None:
    kind = constant_kind(g, t)
    try:
        if kind == "init":
            return np.asarray(g.weights[t]) if g.weights is not None else numpy_helper.to_array(g.initializers[t])
        if kind == "const":
            v = _attr(g.nodes[g.producer[t]], "value")
            return numpy_helper.to_array(v) if isinstance(v, TensorProto) else None
    except Exception:  # noqa: BLE001  an unreadable weight only loses a tie-break, never a match
        return None
    return None


def same_values(a: GraphIndex, ta: str, b: GraphIndex, tb: str) -> bool:
    """Whether two constants hold the same numbers, to half precision (a float16 copy of a float32 weight
    still counts): what breaks a tie between candidates that differ only in their weights."""
    va, vb = constant_value(a, ta), constant_value(b, tb)
    if va is None or vb is None or va.shape != vb.shape:
        return False
    if va.dtype.kind in "fc" or vb.dtype.kind in "fc":
        return bool(np.allclose(va.astype(np.float64), vb.astype(np.float64), rtol=2e-3, atol=1e-6, equal_nan=True))
    return bool(np.array_equal(va, vb))


def _attr_key(a: AttributeProto):
    if a.type == AttributeProto.TENSOR:
        arr = numpy_helper.to_array(a.t)
        return ("t", arr.dtype.str, arr.shape, arr.tobytes())
    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
        return ("g", tuple(tuple(n.op_type for n in sub.node) for sub in graphs))
    return ("v", a.SerializeToString())


def _with_defaults(node: NodeProto) -> dict[str, AttributeProto]:
    """The node's attributes, the schema's defaults filled in: an optimizer writes `axis=-1` where the
    exporter left it out."""
    out = {a.name: a for a in node.attribute}
    try:
        schema = onnx.defs.get_schema(node.op_type, domain=node.domain or "")
    except Exception:  # noqa: BLE001  no schema (a custom domain): compare what is written
        return out
    for name, attr in schema.attributes.items():
        if name not in out and attr.default_value.type != AttributeProto.UNDEFINED:
            out[name] = attr.default_value
    return out


def attributes_score(na: NodeProto, nb: NodeProto) -> int | None:
    """2 when the attributes are equal, 1 when they differ only as a cast model's would (a Cast's float
    target, a float constant's dtype), None when they differ otherwise."""
    xa, xb = _with_defaults(na), _with_defaults(nb)
    if set(xa) != set(xb):
        return None
    score = 2
    for name, attr in xa.items():
        if _attr_key(attr) == _attr_key(xb[name]):
            continue
        if na.op_type == "Cast" and name == "to" and attr.i in FLOAT_TYPES and xb[name].i in FLOAT_TYPES:
            score = 1
        elif attr.type == AttributeProto.TENSOR and tuple(attr.t.dims) == tuple(xb[name].t.dims) \
                and types_compatible(attr.t.data_type, xb[name].t.data_type):
            score = 1
        else:
            return None
    return score


def value_classes(g: GraphIndex, through_carriers: bool = True) -> dict[str, str]:
    """Each tensor's class of equal values: the first of the tensors that carriers hand on, or that nodes of
    the same op_type and attributes compute from the same classes (an exporter's repeated Shape of one
    tensor, its repeated Constant 1). Members are interchangeable: choosing among them guesses nothing.
    through_carriers=False keeps a Cast's output apart from its input (same value, another dtype)."""
    rep: dict[str, str] = {}
    seen: dict[tuple, list[str]] = {}
    for i, node in enumerate(g.nodes):
        ins = tuple(rep.get(t, t) for t in node.input)
        if through_carriers and is_carrier(g, i):
            rep[node.output[0]] = rep.get(source(g, node.output[0]), source(g, node.output[0]))
            continue
        key = (node.op_type, node.domain, ins, tuple(a.SerializeToString() for a in node.attribute))
        first = seen.setdefault(key, list(node.output))
        for t, r in zip(node.output, first):
            rep[t] = r
    return rep


def static_tensors(g: GraphIndex) -> frozenset[str]:
    """Tensors computed from constants and shapes only: what an optimizer folds into an initializer."""
    static = set(g.initializers)
    for node in g.nodes:
        if node.op_type in ("Shape", "Size") or all(t in static for t in node.input if t):
            static.update(t for t in node.output if t)
    return frozenset(static)
