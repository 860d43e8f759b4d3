"""A graph's initializers as the values plans and gradient calls read: torch tensors per device and
dtype, and the same as read-only numpy arrays, each converted when first looked up and kept; except a
big float constant cast to another float dtype (`CAST_AT_USE` elements or more), made anew per lookup."""
from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np
import torch

from ..dtypes import onnx_to_torch, read_only, to_numpy
from ..errors import OnnxGradError
from ..modelfile.index import GraphIndex
from .cast_at_use import CAST_AT_USE
from .values import array_to_tensor, tensor_from_proto


class LazyValues(Mapping):
    """A read-only mapping over `keys` whose values `make(key)` computes on first lookup and keeps,
    those `keeps(key)` allows (default: all); the others are made again at each lookup."""

    def __init__(self, keys, make, keeps=None):
        self._keys, self._make, self._values = keys, make, {}
        self._keeps = keeps

    def keeps(self, key) -> bool:
        return self._keeps is None or self._keeps(key)

    def __getitem__(self, key):
        value = self._values.get(key)
        if value is None:
            if key not in self._keys:
                raise KeyError(key)
            value = self._make(key)
            if self.keeps(key):
                self._values[key] = value
        return value

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class Constants:
    """One graph's initializers, per (device, float dtype). On the CPU in the model's own types the
    tensors share memory with the weights as read (no copy), and what nobody looks up is never read.
    A big float weight cast to another float dtype is not kept: a float64 gradient of GPT-2 124M with
    its embedding as x held a 0.29 GB float64 copy of it for the rest of the explorer's session, as
    plans never do (they cast such constants where a step reads them, cast_at_use.py)."""

    def __init__(self, graph: GraphIndex):
        self.graph = graph
        self._tensors: dict[tuple, LazyValues] = {}
        self._arrays: dict[tuple, LazyValues] = {}

    def tensors(self, device: torch.device, float_dtype: torch.dtype | None) -> Mapping[str, torch.Tensor]:
        """Initializers as torch tensors on `device`, floats promoted to `float_dtype` when given."""
        key = (str(device), float_dtype)
        values = self._tensors.get(key)
        if values is None:
            values = self._tensors[key] = LazyValues(self.graph.initializers,
                                                     lambda name: self._tensor(name, device, float_dtype),
                                                     lambda name: self.keeps(name, float_dtype))
        return values

    def arrays(self, device: torch.device, float_dtype: torch.dtype | None) -> Mapping[str, np.ndarray]:
        """`tensors(device, float_dtype)` as read-only numpy arrays: a gradient call reports the values
        it used, and converting every initializer per call costs more than small models run."""
        key = (str(device), float_dtype)
        values = self._arrays.get(key)
        if values is None:
            tensors = self.tensors(device, float_dtype)
            values = self._arrays[key] = LazyValues(tensors, lambda name: read_only(to_numpy(tensors[name])),
                                                    tensors.keeps)
        return values

    def keeps(self, name: str, float_dtype: torch.dtype | None) -> bool:
        """Whether `tensors(..., float_dtype)[name]` is kept once made: not for a float initializer of
        CAST_AT_USE elements or more stored in another float dtype (a copy as big as the weight)."""
        if float_dtype is None:
            return True
        proto = self.graph.initializers[name]
        try:
            own = onnx_to_torch(proto.data_type)
        except OnnxGradError:  # a type torch lacks: refused when looked up
            return True
        return not own.is_floating_point or own == float_dtype or math.prod(proto.dims) < CAST_AT_USE

    def _tensor(self, name: str, device: torch.device, float_dtype) -> torch.Tensor:
        weights = self.graph.weights
        proto = self.graph.initializers[name]
        if weights is None:
            base = os.path.dirname(self.graph.path) if self.graph.path else None
            return tensor_from_proto(proto, device, float_dtype, base)
        return array_to_tensor(weights.array(name), device, float_dtype, onnx_type=proto.data_type, copy=False)
