"""onnxgrad as an ONNX backend (`onnx.backend.base.Backend`), so onnx's standard runners can drive it.

    from engine.backend import OnnxGradBackend
    rep = OnnxGradBackend.prepare(model_proto)        # every op resolved here
    outputs = rep.run([x, w])                         # positional over the graph's fed inputs, or a dict

Values cross the boundary as numpy arrays (tensors), lists (sequences) and None (empty
optionals); outputs come back in the element type the graph declares, bfloat16 included.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import torch
from onnx import ModelProto, NodeProto, TensorProto, TypeProto, helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from . import load
from .dtypes import FLOAT_ONNX_TYPES, onnx_to_torch, onnx_type_name, parse_device, parse_float_dtype
from .errors import FeedError, OnnxGradError
from .model import Model
from .run.values import array_to_tensor


class UnsupportedTypeError(OnnxGradError):
    """A graph input or output has a type the engine cannot hold (strings, float8, int4, maps...)."""


def type_problem(tp: TypeProto) -> str:
    """'' when the engine can hold a value of this type, else what it cannot hold."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        elem = tp.tensor_type.elem_type
        if elem in (0, TensorProto.STRING):
            return ""  # undeclared: the value decides; strings stay numpy object arrays
        try:
            onnx_to_torch(elem)
        except OnnxGradError:
            return f"tensor({onnx_type_name(elem)})"
        return ""
    if kind == "sequence_type":
        return type_problem(tp.sequence_type.elem_type)
    if kind == "optional_type":
        return type_problem(tp.optional_type.elem_type)
    if kind is None:
        return ""
    return kind.removesuffix("_type")


def _device_of(device: str) -> torch.device:
    """onnx names devices 'CPU', 'CUDA', 'CUDA:1'; torch wants 'cpu', 'cuda:1'."""
    return parse_device(str(device).lower())


def _to_engine(value, tp: TypeProto | None, device: torch.device, float_dtype):
    kind = tp.WhichOneof("value") if tp is not None else None
    if kind == "sequence_type" or (kind is None and isinstance(value, list)):
        elem = tp.sequence_type.elem_type if kind == "sequence_type" else None
        return [_to_engine(v, elem, device, float_dtype) for v in value]
    if kind == "optional_type":
        return None if value is None else _to_engine(value, tp.optional_type.elem_type, device, float_dtype)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        t = value.to(device)
    else:
        arr = np.asarray(value)
        if arr.dtype.kind in "USO":
            return arr.astype(object)  # only string ops read these, as numpy arrays
        elem = tp.tensor_type.elem_type if kind == "tensor_type" else None
        t = array_to_tensor(arr, device, None, onnx_type=elem or None)
    if t.is_floating_point():
        if float_dtype is not None:
            t = t.to(float_dtype)
        elif kind == "tensor_type" and tp.tensor_type.elem_type in FLOAT_ONNX_TYPES:
            t = t.to(onnx_to_torch(tp.tensor_type.elem_type))
    return t


def _to_numpy(value, tp: TypeProto | None, keep_float: bool):
    kind = tp.WhichOneof("value") if tp is not None else None
    if isinstance(value, (list, tuple)):
        elem = tp.sequence_type.elem_type if kind == "sequence_type" else None
        return [_to_numpy(v, elem, keep_float) for v in value]
    if kind == "optional_type":
        return None if value is None else _to_numpy(value, tp.optional_type.elem_type, keep_float)
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.dtype.kind in "USO":
        return value.astype(object)
    t = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    elem = tp.tensor_type.elem_type if kind == "tensor_type" else 0
    if t.dtype == torch.bfloat16:
        t = t.float()
    arr = t.numpy()
    if elem and not (keep_float and arr.dtype.kind == "f"):
        want = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        if arr.dtype != want:
            arr = arr.astype(want)
    return arr


class OnnxGradRep(BackendRep):
    """A prepared model: `run(inputs)` returns the graph outputs in order (a namedtuple, also indexable by name)."""

    def __init__(self, model: Model, device: torch.device, dtype=None):
        self.model = model
        self.device = device
        self.float_dtype = parse_float_dtype(dtype)
        g = model.graph.model.graph
        self._types = {vi.name: vi.type for vi in list(g.input) + list(g.output)}
        self.input_names = [n for n in (vi.name for vi in g.input) if n not in model.graph.initializers]
        self.output_names = [vi.name for vi in g.output]

    def run(self, inputs: Sequence[Any] | Mapping[str, Any], **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise FeedError(f"got {len(inputs)} inputs but the graph takes {len(self.input_names)}")
            feeds = dict(zip(self.input_names, inputs))
        self.model.check_feed_names(feeds)
        sources = list(feeds)
        plan = self.model.prepare(sources, self.output_names, device=self.device, dtype=self.float_dtype)
        values = [_to_engine(feeds[n], self._types.get(n), self.device, self.float_dtype) for n in sources]
        with torch.no_grad():
            out = plan.run(values)
        keep = self.float_dtype is not None
        arrays = [_to_numpy(v, self._types.get(n), keep) for n, v in zip(self.output_names, out)]
        return namedtupledict("Outputs", self.output_names)(*arrays)


class OnnxGradBackend(Backend):
    """The engine behind onnx's Backend interface. Extra keyword: `dtype` ('float64' promotes every float)."""

    @classmethod
    def is_compatible(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            cls.prepare(model, device, **kwargs)
        except OnnxGradError:
            return False
        return True

    @classmethod
    def prepare(cls, model: ModelProto, device: str = "CPU", *, check: bool = False, dtype=None,
                **kwargs: Any) -> OnnxGradRep:
        g = model.graph
        for vi in list(g.input) + list(g.output):
            problem = type_problem(vi.type)
            if problem:
                raise UnsupportedTypeError(f"{vi.name!r} has type {problem}, which the engine cannot hold")
        return OnnxGradRep(load(model, check=check), _device_of(device), dtype)

    @classmethod
    def run_model(cls, model: ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on numpy inputs (positional, matching node.input; '' entries are skipped)."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        values = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        names = [n for n in node.input if n]
        graph_inputs = []
        for name, v in zip(names, values):
            arr = np.asarray(v)
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        graph_outputs = []
        for k, name in enumerate(n for n in node.output if n):
            if outputs_info is not None and k < len(outputs_info):
                dt, shape = outputs_info[k]
                graph_outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape))
            else:
                graph_outputs.append(helper.make_empty_tensor_value_info(name))
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        domain = node.domain or ""
        imports = [helper.make_opsetid("", opset)]
        if domain not in ("", "ai.onnx"):
            imports.append(helper.make_opsetid(domain, kwargs.pop("domain_version", 1)))
        model = helper.make_model(graph, opset_imports=imports)
        return cls.prepare(model, device, **kwargs).run(values[: len(names)])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            _device_of(device)
        except OnnxGradError:
            return False
        return True


prepare = OnnxGradBackend.prepare
run_model = OnnxGradBackend.run_model
run_node = OnnxGradBackend.run_node
supports_device = OnnxGradBackend.supports_device
