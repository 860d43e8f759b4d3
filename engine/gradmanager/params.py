"""A model's trainable initializers as torch tensors, their gradients, and writing them back to ONNX."""
from __future__ import annotations

import os
from typing import Iterator, Mapping

import torch
from onnx import ModelProto, TensorProto

from ..dtypes import onnx_to_torch
from ..errors import ModelLoadError
from ..model import Model
from ..modelfile.writer import write


class Parameters(Mapping[str, torch.Tensor]):
    """The float initializers that are not graph inputs, as leaf tensors that require grad.

    Gradients belong to the tensors, as `.grad` does in MegEngine: a parameter's lives in
    `tensor.grad` (so any `torch.optim` optimizer steps it), an input's or intermediate's in
    `extra_grads`. Managers built on the same Parameters share both and see each other's
    recordings, which is how a second manager takes second derivatives.
    """

    def __init__(self, model: Model, device: torch.device, dtype: torch.dtype | None):
        self.model, self.device, self.dtype = model, device, dtype
        graph = model.graph
        constants = model.constants(device, dtype)
        # Cloned: stepping a parameter must not change the Model's cached constants.
        self._tensors = {
            name: constants[name].detach().clone().requires_grad_()
            for name in graph.initializers
            if name not in graph.overridable and constants[name].is_floating_point()
        }
        self.extra_grads: dict[str, torch.Tensor] = {}
        self.recorders: list = []  # GradManagers recording now, in the order they started

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}{tuple(t.shape)}" for n, t in self._tensors.items())
        return f"<Parameters of {self.model.name!r}: {shapes}>"

    # --- gradients -----------------------------------------------------------------------------
    def grad_of(self, name: str) -> torch.Tensor | None:
        return self._tensors[name].grad if name in self._tensors else self.extra_grads.get(name)

    def accumulate(self, name: str, grad: torch.Tensor, keep_graph: bool) -> None:
        """`.grad += grad`, out of place so a gradient that carries a graph stays differentiable."""
        old = self.grad_of(name)
        if old is not None:
            grad = (old if keep_graph else old.detach()) + grad
        if name in self._tensors:
            self._tensors[name].grad = grad
        else:
            self.extra_grads[name] = grad

    def zero_grad(self, names=None) -> None:
        for name in self._tensors if names is None else names:
            if name in self._tensors:
                self._tensors[name].grad = None
        if names is None:
            self.extra_grads.clear()
        else:
            for name in names:
                self.extra_grads.pop(name, None)

    # --- writing back --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, external_data: bool | None = None) -> bool:
        """Write the model with every parameter's current value; all else is the model as loaded.
        `external_data`: None writes the weights to PATH.data only when the model is over protobuf's
        2 GB; True or False forces it. Returns whether external data was written."""
        proto, data = source_model(self.model)
        by_name = {t.name: t for t in proto.graph.initializer}
        for name, value in self._tensors.items():
            init = by_name.get(name)
            if init is None or tuple(init.dims) != tuple(value.shape):
                raise ModelLoadError(f"the model file changed since it was loaded: initializer {name!r} differs")
            data[name] = initializer_bytes(init, value)
        return write(proto, data, os.fspath(path), external=external_data)


def source_model(model: Model) -> tuple[ModelProto, dict]:
    """The model as loaded (shape inference's additions left out), without the bytes of its large
    initializers, and where those bytes are, by name (a writer copies them from there)."""
    graph = model.graph
    if graph.source is None or graph.weights is None:
        raise ModelLoadError("this model was not loaded from a file, bytes or a proto; nothing to write back")
    graph.weights.require_unchanged()  # what is not read yet must come from the files as they were
    return graph.source, {name: graph.weights.stored(name) for name in graph.weights.detached()}


def initializer_bytes(init: TensorProto, value: torch.Tensor) -> memoryview:
    """`value` cast to the initializer's own element type, as ONNX raw_data bytes (little-endian, as
    torch's CPU layout here)."""
    t = value.detach().to("cpu", onnx_to_torch(init.data_type)).contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: write the raw 16-bit patterns
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")
