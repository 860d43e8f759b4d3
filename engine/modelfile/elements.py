"""ONNX element types as the file states them, without torch (engine/dtypes.py maps them to torch's)."""
from onnx import TensorProto

FLOAT_ONNX_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def onnx_type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type{elem_type}"
