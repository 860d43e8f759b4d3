"""ONNX attributes -> Python keyword arguments for op functions."""
from __future__ import annotations

import torch
from onnx import AttributeProto, TensorProto

from ..dtypes import FLOAT_ONNX_TYPES
from ..errors import OnnxGradError
from .values import tensor_from_proto

# Attributes that name an ONNX element type. When a run promotes floats (say to float64 for
# finite differences), a cast to a float type must promote too, or the chain drops precision.
DTYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype"})


def convert(attr: AttributeProto, device: torch.device, float_dtype: torch.dtype | None):
    A = AttributeProto
    if attr.type == A.FLOAT:
        return float(attr.f)
    if attr.type == A.INT:
        if attr.name in DTYPE_ATTRIBUTES and float_dtype is not None and attr.i in FLOAT_ONNX_TYPES:
            return _onnx_type_of(float_dtype)
        return int(attr.i)
    if attr.type == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if attr.type == A.TENSOR:
        return tensor_from_proto(attr.t, device, float_dtype)
    if attr.type == A.FLOATS:
        return [float(v) for v in attr.floats]
    if attr.type == A.INTS:
        return [int(v) for v in attr.ints]
    if attr.type == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if attr.type == A.TENSORS:
        return [tensor_from_proto(t, device, float_dtype) for t in attr.tensors]
    if attr.type == A.GRAPH:
        return attr.g
    if attr.type == A.GRAPHS:
        return list(attr.graphs)
    if attr.type == A.TYPE_PROTO:
        return attr.tp
    raise OnnxGradError(f"attribute {attr.name!r} has an unsupported type {AttributeProto.AttributeType.Name(attr.type)}")


def _onnx_type_of(dtype: torch.dtype) -> int:
    return {
        torch.float32: TensorProto.FLOAT,
        torch.float64: TensorProto.DOUBLE,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
    }[dtype]
