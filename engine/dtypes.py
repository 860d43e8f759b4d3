"""ONNX element types and their torch / numpy counterparts."""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch
from onnx import TensorProto

from .errors import OnnxGradError
from .modelfile.elements import FLOAT_ONNX_TYPES, onnx_type_name  # noqa: F401  (the torch-free half)

# torch has no uint16/32/64 arithmetic worth relying on; they are widened to the next signed
# type and narrowed back when results leave the engine.
_ONNX_TO_TORCH: dict[int, torch.dtype] = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT8: torch.int8,
    TensorProto.INT16: torch.int16,
    TensorProto.INT32: torch.int32,
    TensorProto.INT64: torch.int64,
    TensorProto.UINT8: torch.uint8,
    TensorProto.UINT16: torch.int32,
    TensorProto.UINT32: torch.int64,
    TensorProto.UINT64: torch.int64,
    TensorProto.BOOL: torch.bool,
    TensorProto.COMPLEX64: torch.complex64,
    TensorProto.COMPLEX128: torch.complex128,
}


HALF_DTYPES = (torch.float16, torch.bfloat16)

_NAMES = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64,
    "double": torch.float64, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


def onnx_to_torch(elem_type: int) -> torch.dtype:
    try:
        return _ONNX_TO_TORCH[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise OnnxGradError(f"element type {name} is not supported (only numeric and bool tensors are)") from None


def parse_float_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """None keeps the model's own float types; otherwise every float tensor is computed in `dtype`."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _NAMES[str(dtype).lower()]
    except KeyError:
        raise OnnxGradError(f"unknown dtype {dtype!r}; choose float16, bfloat16, float32 or float64") from None


def computes_in_float32(fn: Callable) -> Callable:
    """Run `fn` in float32 when its inputs are float16 or bfloat16, and round its float results
    back: for ops whose torch CPU kernels have no half version, or lose too much in one (the ONNX
    types stay what they are; only the arithmetic is wider). docs/semantics.md lists them."""

    @functools.wraps(fn)
    def widened(*args, **kwargs):
        half = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in HALF_DTYPES), None)
        if half is None:
            return fn(*args, **kwargs)
        out = fn(*[a.float() if isinstance(a, torch.Tensor) and a.dtype == half else a for a in args], **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(_narrow(o, half) for o in out)
        return _narrow(out, half)

    widened.half_in_float32 = True
    return widened


def _narrow(t, half: torch.dtype):
    return t.to(half) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t


def type_clash(node, opset: int, args: list) -> str:
    """Why `node`'s inputs break its schema's type rule (two inputs bound to one type variable T
    with different dtypes), or ''. A torch error such as "mixed dtype (CPU)" says only the symptom."""
    import onnx

    sequence = _sequence_clash(node, opset, args)
    if sequence:
        return sequence
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # no schema (a custom op): nothing to say beyond torch's message
        return ""
    variables = {c.type_param_str for c in schema.type_constraints}
    params = list(schema.inputs)
    seen: dict[str, tuple[str, torch.dtype]] = {}
    for k, (name, value) in enumerate(zip(node.input, args)):
        if not params or not isinstance(value, torch.Tensor):
            continue
        param = params[min(k, len(params) - 1)]
        if param.type_str not in variables:
            continue
        if param.type_str in seen and seen[param.type_str][1] != value.dtype:
            first, dtype = seen[param.type_str]
            return (f"inputs {first!r} ({_name(dtype)}) and {name!r} ({_name(value.dtype)}) must have one type "
                    f"({param.type_str} in {node.op_type}'s schema): the model is mistyped")
        seen.setdefault(param.type_str, (name, value.dtype))
    return ""


def _sequence_clash(node, opset: int, args: list) -> str:
    """Which input is a sequence where `node`'s schema (at its opset, else onnx's latest: the engine runs
    some ops below the opset onnx added them in) takes a tensor, or ''."""
    import onnx

    if not any(isinstance(a, (list, tuple)) for a in args):
        return ""
    schema = None
    for at in (opset, None):
        try:
            schema = onnx.defs.get_schema(node.op_type, node.domain or "") if at is None else \
                onnx.defs.get_schema(node.op_type, at, node.domain or "")
            break
        except Exception:  # noqa: BLE001 - not at this opset (or a custom op): the next, or nothing to say
            continue
    if schema is None or not schema.inputs:
        return ""
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    for k, (name, value) in enumerate(zip(node.input, args)):
        param = schema.inputs[min(k, len(schema.inputs) - 1)]
        if isinstance(value, (list, tuple)) and \
                not any(t.startswith("seq(") for t in allowed.get(param.type_str, [param.type_str])):
            return f"input {name!r} is a sequence; {node.op_type}'s input {param.name!r} takes a tensor"
    return ""


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_float(t: torch.Tensor | np.ndarray) -> bool:
    if isinstance(t, torch.Tensor):
        return t.is_floating_point()
    return np.issubdtype(np.asarray(t).dtype, np.floating)


def to_numpy(t) -> np.ndarray:
    """A torch tensor (any device, maybe requiring grad) as a numpy array; bfloat16 becomes float32."""
    if isinstance(t, np.ndarray):
        return t
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    # Each step only when needed: Model.gradient converts every gradient and value per call.
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if not t.is_cpu:
        t = t.cpu()
    return t.numpy()


def read_only(arr: np.ndarray) -> np.ndarray:
    """`arr`, or a read-only view of it: values handed out may share memory with cached constants."""
    if isinstance(arr, np.ndarray) and arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


_CPU = torch.device("cpu")


def parse_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "cpu" or (isinstance(device, torch.device) and device.type == "cpu"):
        return _CPU  # the common case, without torch.device's parsing (a check calls this a few times)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OnnxGradError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise OnnxGradError(f"device {device!r} requested but CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise OnnxGradError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "mps"):
        raise OnnxGradError(f"unsupported device {device!r}; use cpu, cuda or cuda:N")
    return dev
