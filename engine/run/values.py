"""Values as the engine's tensors: a weight's array or a TensorProto -> a torch tensor of the type the
run asks for, sharing the array's memory wherever no conversion is needed."""
from __future__ import annotations

import warnings

import numpy as np
import torch
from onnx import TensorProto, numpy_helper

from ..dtypes import FLOAT_ONNX_TYPES, onnx_to_torch
from ..errors import OnnxGradError


def tensor_from_proto(proto: TensorProto, device: torch.device, float_dtype: torch.dtype | None = None,
                      base_dir: str | None = None) -> torch.Tensor:
    try:
        arr = numpy_helper.to_array(proto, base_dir or "")
    except Exception as exc:
        raise OnnxGradError(f"cannot read tensor {proto.name!r}: {exc}") from None
    return array_to_tensor(arr, device, float_dtype, onnx_type=proto.data_type)


def array_to_tensor(arr, device: torch.device, float_dtype: torch.dtype | None = None,
                    onnx_type: int | None = None, copy: bool = True) -> torch.Tensor:
    """`arr` as a tensor of the engine's type for `onnx_type`. `copy=False` shares the array's memory
    where no conversion is needed (the model's weights; a read-only array must then never be written)."""
    arr = np.asarray(arr)
    if arr.dtype.kind in "USO":
        raise OnnxGradError("string tensors are not supported")
    if onnx_type is not None and onnx_type not in FLOAT_ONNX_TYPES and arr.dtype.kind in "fiub":
        target = onnx_to_torch(onnx_type)
    else:
        target = None
    if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:  # uint16/32/64: torch has no arithmetic for them
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "V" and str(arr.dtype) == "bfloat16":  # ml_dtypes bfloat16, as onnx's numpy_helper returns it
        t = _shared(arr.view(np.int16)).view(torch.bfloat16) if not copy else \
            torch.from_numpy(arr.astype(np.float32)).to(torch.bfloat16)
    elif arr.dtype.kind == "V" or arr.dtype.kind not in "fiubc":  # float8, int4, ... (ml_dtypes)
        raise OnnxGradError(f"element type {arr.dtype} is not supported (torch has no arithmetic for it)")
    elif copy or not arr.flags.c_contiguous:
        t = torch.from_numpy(np.array(arr, copy=True, order="C"))
    else:
        t = _shared(arr)
    if target is not None and t.dtype != target:
        t = t.to(target)
    if float_dtype is not None and t.is_floating_point():
        t = t.to(float_dtype)
    return t.to(device)


def _shared(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():  # bytes the caller gave: shared, and never written (ops do not write inputs)
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)
