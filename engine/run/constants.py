"""A graph's initializers as the values plans and gradient calls read: torch tensors per device and
dtype, and the same as read-only numpy arrays, each converted when first looked up and kept."""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import torch

from ..dtypes import read_only, to_numpy
from ..modelfile.index import GraphIndex
from .values import array_to_tensor, tensor_from_proto


class LazyValues(Mapping):
    """A read-only mapping over `keys` whose values `make(key)` computes on first lookup and keeps."""

    def __init__(self, keys, make):
        self._keys, self._make, self._values = keys, make, {}

    def __getitem__(self, key):
        value = self._values.get(key)
        if value is None:
            if key not in self._keys:
                raise KeyError(key)
            value = self._values[key] = self._make(key)
        return value

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class Constants:
    """One graph's initializers, per (device, float dtype). On the CPU in the model's own types the
    tensors share memory with the weights as read (no copy), and what nobody looks up is never read."""

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
                                                     lambda name: self._tensor(name, device, float_dtype))
        return values

    def arrays(self, device: torch.device, float_dtype: torch.dtype | None) -> Mapping[str, np.ndarray]:
        """`tensors(device, float_dtype)` as read-only numpy arrays: a gradient call reports the values
        it used, and converting every initializer per call costs more than small models run."""
        key = (str(device), float_dtype)
        values = self._arrays.get(key)
        if values is None:
            tensors = self.tensors(device, float_dtype)
            values = self._arrays[key] = LazyValues(tensors, lambda name: read_only(to_numpy(tensors[name])))
        return values

    def _tensor(self, name: str, device: torch.device, float_dtype) -> torch.Tensor:
        weights = self.graph.weights
        proto = self.graph.initializers[name]
        if weights is None:
            base = os.path.dirname(self.graph.path) if self.graph.path else None
            return tensor_from_proto(proto, device, float_dtype, base)
        return array_to_tensor(weights.array(name), device, float_dtype, onnx_type=proto.data_type, copy=False)
