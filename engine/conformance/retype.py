"""A model with one float element type replaced by another: graph inputs, initializers, constant
tensors and subgraphs (values rounded, finite ones saturating at the new type's largest), so the
same graph runs in float16 or bfloat16, or a bfloat16 model in float32 for a runtime without
bfloat16 kernels. Output types are left for shape inference to give."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Attributes that name an element type (Cast's `to`, EyeLike's `dtype`...): retargeted with `casts`.
TYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype"})


def np_dtype(elem_type: int):
    return helper.tensor_dtype_to_np_dtype(elem_type)


def cast(value, elem_type: int | None, saturate: bool = False):
    """A float value (or a sequence of them) as `elem_type`; anything else unchanged. `saturate`
    (for inputs): finite values beyond the type's range become its largest, not inf, so that a
    case about large numbers stays one (quantizing 70000 saturates either way; quantizing inf is
    left undefined by the reference, whose numpy casts inf to int32's minimum)."""
    if isinstance(value, list):
        return [cast(v, elem_type, saturate) for v in value]
    if (elem_type is None or not isinstance(value, np.ndarray)
            or not (value.dtype.kind == "f" or value.dtype.name == "bfloat16")):
        return value
    dtype = np_dtype(elem_type)
    if saturate and dtype != value.dtype:
        big = float(ml_dtypes.finfo(dtype).max)
        value = np.where(np.isfinite(value), np.clip(value, -big, big), value)
    with np.errstate(over="ignore"):  # an output beyond the type's range becomes inf, as a cast does
        return value.astype(dtype)


class Retype:
    """Replaces element type `src` by `dst` in a model; `casts` retargets Cast-like attributes too."""

    def __init__(self, src: int, dst: int, opsets: dict[str, int], casts: bool = False):
        self.src, self.dst, self.opsets, self.casts = src, dst, opsets, casts
        self.wanted = f"tensor({helper.tensor_dtype_to_string(dst).split('.')[-1].lower()})"

    def tensor(self, t: TensorProto) -> TensorProto:
        if t.data_type != self.src:
            return t
        return numpy_helper.from_array(cast(numpy_helper.to_array(t), self.dst, saturate=True), t.name)

    def type(self, tp: onnx.TypeProto) -> None:
        kind = tp.WhichOneof("value")
        if kind == "tensor_type" and tp.tensor_type.elem_type == self.src:
            tp.tensor_type.elem_type = self.dst
        elif kind in ("sequence_type", "optional_type"):
            self.type(getattr(tp, kind).elem_type)

    def excluded(self, g: onnx.GraphProto) -> set[str]:
        """Tensors read where the op's schema does not admit `dst` (Resize's scales, NMS boxes):
        they keep their type, as a model in `dst` keeps them."""
        keep = set()
        for node in g.node:
            try:
                schema = onnx.defs.get_schema(node.op_type, self.opsets.get(node.domain or "", 1), node.domain or "")
            except Exception:  # no schema (a custom domain): leave its inputs to the conversion
                continue
            allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
            params = list(schema.inputs)
            for k, name in enumerate(node.input):
                if not params:
                    break
                p = params[min(k, len(params) - 1)]
                if self.wanted not in allowed.get(p.type_str, {p.type_str}):
                    keep.add(name)
        return keep

    def graph(self, g: onnx.GraphProto, top: bool = True) -> None:
        keep = self.excluded(g)
        for v in g.input:
            if v.name not in keep:
                self.type(v.type)
        for i, t in enumerate(g.initializer):
            if t.name not in keep:
                g.initializer[i].CopyFrom(self.tensor(t))
        if not top:  # a subgraph's outputs are typed by its body, like the main graph's
            for v in g.output:
                self.type(v.type)
        del g.value_info[:]
        for node in g.node:
            if any(o in keep for o in node.output):
                continue
            for a in node.attribute:
                self.attribute(a)

    def attribute(self, a: onnx.AttributeProto) -> None:
        A = onnx.AttributeProto
        if a.type == A.TENSOR:
            a.t.CopyFrom(self.tensor(a.t))
        elif a.type == A.TENSORS:
            for i, t in enumerate(a.tensors):
                a.tensors[i].CopyFrom(self.tensor(t))
        elif a.type == A.GRAPH:
            self.graph(a.g, top=False)
        elif a.type == A.GRAPHS:
            for sub in a.graphs:
                self.graph(sub, top=False)
        elif a.type == A.INT and self.casts and a.name in TYPE_ATTRIBUTES and a.i == self.src:
            a.i = self.dst


def retyped(model: onnx.ModelProto, src: int, dst: int, *, casts: bool = False) -> onnx.ModelProto:
    """A copy of `model` with `src` tensors in `dst`; the graph's outputs keep their declared types
    unless `casts` (then every `src` becomes `dst`, a whole model widened or narrowed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    Retype(src, dst, {i.domain or "": i.version for i in out.opset_import}, casts).graph(out.graph)
    if casts:
        for v in out.graph.output:
            Retype(src, dst, {}).type(v.type)
    return out
