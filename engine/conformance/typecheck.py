"""Every value of a run in the element type ONNX's type rules give it (onnx shape inference on the
model), the check that a float16 or bfloat16 model stays in its own dtype from node to node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import onnx
import torch

from ..dtypes import onnx_to_torch
from ..run.plan import StepObserver


@dataclass(frozen=True)
class TypeMismatch:
    tensor: str
    node: str
    op_type: str
    got: str
    expected: str

    def __str__(self) -> str:
        return f"{self.tensor!r} from {self.node!r} ({self.op_type}) is {self.got}, ONNX's types say {self.expected}"


class _Recorder(StepObserver):
    def __init__(self, types: dict[str, torch.dtype]):
        self.types, self.found = types, []

    def outputs(self, step, args, names, outs):
        for name, value in zip(names, outs):
            want = self.types.get(name)
            if want is not None and isinstance(value, torch.Tensor) and value.dtype != want:
                self.found.append(TypeMismatch(name, step.name, step.op_type, _name(value.dtype), _name(want)))
        return outs


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def inferred_types(proto: onnx.ModelProto) -> dict[str, torch.dtype]:
    """Element types shape inference gives every tensor it types (in the engine's torch dtypes)."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    g = inferred.graph
    out = {}
    for v in list(g.value_info) + list(g.output):
        elem = v.type.tensor_type.elem_type if v.type.WhichOneof("value") == "tensor_type" else 0
        try:
            out[v.name] = onnx_to_torch(elem) if elem else None
        except Exception:  # a type the engine does not hold (strings, float8): nothing to compare
            continue
    return {n: t for n, t in out.items() if t is not None}


def dtype_mismatches(model, proto: onnx.ModelProto, feeds: Mapping[str, object]) -> list[TypeMismatch]:
    """Values of one forward run of `model` (loaded from `proto`) whose dtype is not the inferred one."""
    types = inferred_types(proto)
    plan = model.prepare(list(feeds), model.outputs, keep_all=True)
    device = torch.device("cpu")
    values = [model.to_tensor(n, feeds[n], device, None) for n in plan.sources]
    recorder = _Recorder(types)
    with torch.no_grad():
        plan.run_observed(values, recorder)
    return recorder.found
