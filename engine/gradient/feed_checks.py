"""A value against what the model declares for its tensor: dtype kind and shape, symbolic dims as
`dims` sets them; one-line FeedErrors that say what was expected."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..errors import FeedError
from ..modelfile.dim_expr import evaluate
from ..modelfile.index import GraphIndex
from .dims import Dims


def _kinds(elem_type: int | None) -> str | None:
    """The numpy kinds a value of this ONNX element type may have (floats of any width for floats)."""
    from ..dtypes import FLOAT_ONNX_TYPES

    if elem_type is None or elem_type == TensorProto.UNDEFINED:
        return None
    if elem_type in FLOAT_ONNX_TYPES:
        return "f"
    if elem_type == TensorProto.BOOL:
        return "b"
    if elem_type == TensorProto.STRING:
        return "USO"
    if elem_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return "c"
    return "iu"


def _kind_of(value) -> str:
    """The numpy kind of an array or a torch tensor, without importing torch."""
    dtype = value.dtype
    if isinstance(dtype, np.dtype):
        if dtype.kind == "V":  # ml_dtypes' bfloat16, float8_*, int4, uint4
            name = str(dtype)
            return "f" if "float" in name else "i" if "int" in name else "V"
        return dtype.kind
    if value.is_floating_point():
        return "f"
    if value.is_complex():
        return "c"
    return "b" if str(dtype) == "torch.bool" else "i"


def type_text(graph: GraphIndex, name: str) -> str:
    """What the model declares for `name`, as messages show it: "float32 [N, 8]"."""
    info = graph.types.get(name)
    if info is None:
        return "any value"
    dtype = "a tensor"
    if info.elem_type == TensorProto.STRING:
        dtype = "string"
    elif info.elem_type:
        try:
            dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)))
        except Exception:
            dtype = helper.tensor_dtype_to_string(info.elem_type).removeprefix("TensorProto.").lower()
    if info.shape is None:
        return f"{dtype} of any shape"
    return f"{dtype} [{', '.join(str(d) if d not in (None, '') else '?' for d in info.shape)}]"


def check_feed(graph: GraphIndex, name: str, value, dims: Dims | None = None) -> None:
    """FeedError (one line, naming the tensor and what it expects) when `value`'s shape or dtype
    cannot be what the model declares for `name`. Symbolic dims accept any size unless `dims`
    sets them, unknown dims any size; a float tensor accepts floats of any width (they are
    converted), an integer tensor any integers.
    """
    info = graph.types.get(name)
    if info is None or isinstance(value, (list, tuple)) or not hasattr(value, "dtype"):
        return
    want = _kinds(info.elem_type)
    shape = tuple(int(d) for d in value.shape)
    dtype_ok = want is None or _kind_of(value) in want
    shape_ok = info.shape is None or (len(shape) == len(info.shape) and all(
        not isinstance(d, int) or d <= 0 or d == s for d, s in zip(info.shape, shape)))
    clash = [(d, s, v) for d, s in zip(info.shape, shape) if (v := evaluate(d, dims)) is not None
             and v != s] if dims and shape_ok and info.shape is not None else []
    if not (dtype_ok and shape_ok) or clash:
        # str(dtype) costs more than the whole check: only an error message needs it
        got = str(value.dtype).removeprefix("torch.")
        why = "".join(f"; {d} is {'set to ' * (d in dims)}{v}, not {s}" for d, s, v in clash[:1])
        raise FeedError(f"feed {name!r}: expected {type_text(graph, name)}, got {got} {list(shape)}{why}")
