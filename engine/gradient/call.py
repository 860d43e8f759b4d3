"""`Model.gradient`'s per-call work, worked out once per (selection, feed names, device, dtype).

On a model whose gradient takes a couple of milliseconds, validating the selection, walking the
cut graph for fed initializers, looking up the prepared gradient and converting feeds through the
general path cost a noticeable share of the call, all of it the same from one call to the next
with the same names. A `GradientCall` keeps what depends only on the names: the prepared
gradient, where each input comes from (a feed, a cached constant, a seeded default), and for each
feed what the model declares (its numpy dtype and shape), so that a numpy array of exactly that
type is checked with a few comparisons and used in place, not copied (the result's `values`
show it through a read-only view); any other value takes `Model.to_tensor`, which converts it
or says in one line why not. The backward graph's statistics and the explorer's step mode take
their inputs from the same call (`Model.gradient_call`), so a feed means the same to all of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np
import torch
from onnx import TensorProto, helper

from ..dtypes import FLOAT_ONNX_TYPES, read_only, to_numpy
from ..modelfile.index import GraphIndex
from .prepared import GradientOutput, GradientResult, PreparedGradient

if TYPE_CHECKING:
    from ..run.constants import LazyValues
    from .selection import GradientSpec

FEED, CONSTANT, DEFAULT = 0, 1, 2
# Element types whose CPU tensors `.numpy()` takes as they are (numpy has no bfloat16).
PLAIN_NUMPY_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16})


class _Declared:
    """What a fed tensor must be for the quick path: exactly this numpy dtype, shapes that fit."""

    __slots__ = ("dtype", "dims", "exact")

    def __init__(self, elem_type: int, shape):
        self.dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        # None: a free dim (symbolic, unknown or not positive), else the size it must have.
        self.dims = None if shape is None else tuple(d if isinstance(d, int) and d > 0 else None for d in shape)
        self.exact = self.dims is not None and None not in self.dims

    def fits(self, value) -> bool:
        if type(value) is not np.ndarray or value.dtype != self.dtype:
            return False
        if self.dims is None:
            return True
        shape = value.shape
        if self.exact:
            return shape == self.dims
        return len(shape) == len(self.dims) and all(d is None or d == s for d, s in zip(self.dims, shape))


class Feeder(Protocol):
    """What a GradientCall needs of its model besides the pieces it is given (engine.Model is one):
    declared types, the general conversion of a feed, and the shared defaults."""

    graph: GraphIndex

    def to_tensor(self, name: str, value, device: torch.device, float_dtype) -> torch.Tensor: ...

    def selection_values(self, spec: "GradientSpec", feeds: Mapping[str, object], seed: int = ...,
                         names: Sequence[str] | None = ..., dims: Mapping[str, int] | None = ...
                         ) -> dict[str, np.ndarray]: ...


class GradientCall:
    """dy/dxs for one selection, feed names, device and dtype; call with the feeds' values.

    `inputs(feeds)` are the tensors `prepared` takes and the values they hold; `result(out, values)`
    what a call returns. `constants` and `arrays`: the initializers as tensors and as read-only
    arrays on the prepared gradient's device and dtype (run/constants.py: those it `keeps` are held
    here; a big weight cast to the call's dtype is cast at each call)."""

    def __init__(self, model: Feeder, prepared: PreparedGradient, feed_names: tuple[str, ...],
                 constants: LazyValues, arrays: Mapping[str, np.ndarray]):
        self.model, self.prepared, self.spec, self.constants = model, prepared, prepared.spec, constants
        self.dev, self.fdt = dev, fdt = prepared.device, prepared.float_dtype
        spec, fed = self.spec, dict.fromkeys(feed_names)
        # (name, FEED/CONSTANT/DEFAULT, a constant tensor or the feed's _Declared, kept in `values`?)
        self.sources = []
        for n in spec.inputs:
            if n in fed:
                self.sources.append((n, FEED, self._declared(n), True))
            elif n in constants:  # a cast copy as big as the weight is made per call, never held
                self.sources.append((n, CONSTANT, (constants[n], arrays[n]) if constants.keeps(n) else None, True))
            else:
                self.sources.append((n, DEFAULT, None, True))
        self.sources += [(n, FEED, self._declared(n), False) for n in prepared.extra_inputs]
        self.unfed = [n for n, kind, _, _ in self.sources if kind == DEFAULT]
        self.device_label = str(dev)
        self.dtype_label = str(fdt).removeprefix("torch.") if fdt else "native"
        # Asked once here, not per call: `torch.device.type` builds a C++ ostringstream each time.
        self.on_cpu = dev.type == "cpu"
        # y and the gradients come back as plain CPU tensors numpy takes as they are (no bfloat16):
        # `.numpy()` then, without `to_numpy`'s checks.
        self.plain_out = self.on_cpu and self._plain_numpy((spec.y, *spec.xs))

    def _plain_numpy(self, names) -> bool:
        if self.fdt is not None:
            return self.fdt != torch.bfloat16
        types = self.model.graph.types
        return all(types.get(n) is not None and types[n].elem_type in PLAIN_NUMPY_TYPES for n in names)

    def _declared(self, name: str) -> _Declared | None:
        info = self.model.graph.types.get(name)
        if info is None or info.elem_type is None or info.elem_type not in FLOAT_ONNX_TYPES:
            return None  # integers, strings, sequences: the general path
        try:
            return _Declared(info.elem_type, info.shape)
        except (TypeError, ValueError, KeyError):  # bfloat16 and other types numpy lacks
            return None

    def _feed(self, name: str, value, declared: _Declared | None) -> tuple[torch.Tensor, np.ndarray]:
        """(the tensor, the values as used: writable still, `result` hands them out read-only)."""
        if declared is None or not declared.fits(value):
            t = self.model.to_tensor(name, value if isinstance(value, torch.Tensor) else np.asarray(value), self.dev,
                                     self.fdt)
            return t, to_numpy(t)
        # Used where it lies, as the prepared call would take it: in a loop of calls a copy per call
        # cost 1-3% of a millisecond model, far more than the copy alone (benchmarks.md). Only an
        # array torch cannot wrap as it is (strided, or read-only: from_numpy warns) is copied.
        flags = value.flags
        if flags.c_contiguous and flags.writeable:
            t, used = torch.from_numpy(value), value
        else:
            t = torch.from_numpy(np.array(value, order="C"))
            used = t.numpy()
        if not self.on_cpu or (self.fdt is not None and self.fdt != t.dtype):
            t = t.to(device=self.dev, dtype=self.fdt)
            used = to_numpy(t)
        return t, used

    def _cast_constant(self, name: str) -> tuple[torch.Tensor, np.ndarray]:
        t = self.constants[name]
        return t, to_numpy(t)

    def inputs(self, feeds: Mapping[str, object], seed: int = 0, dims: Mapping[str, int] | None = None
               ) -> tuple[list[torch.Tensor], dict[str, np.ndarray]]:
        """The tensors `prepared` takes (xs, zs, then the fed initializers it reads), each from its
        feed, the model's constant or the shared default; and the values of xs ∪ zs as used."""
        spec = self.spec
        defaults = self.model.selection_values(spec, feeds, seed=seed, names=self.unfed, dims=dims) \
            if self.unfed else None
        tensors, values = [], {}
        for name, kind, info, kept in self.sources:
            if kind == FEED:
                t, used = self._feed(name, feeds[name], info)
            elif kind == CONSTANT:
                t, used = info if info is not None else self._cast_constant(name)
            else:
                t = self.model.to_tensor(name, defaults[name], self.dev, self.fdt)
                used = to_numpy(t)
            tensors.append(t)
            if kept:
                values[name] = used
        return tensors, values

    def __call__(self, feeds: Mapping[str, object], dy=None, seed: int = 0,
                 dims: Mapping[str, int] | None = None) -> GradientResult:
        tensors, values = self.inputs(feeds, seed, dims)
        out = self.prepared(*tensors) if dy is None else self.prepared(*tensors, dy=dy)
        return self.result(out, values, dy is not None)

    def result(self, out: GradientOutput, values: dict[str, np.ndarray], seeded: bool = False) -> GradientResult:
        """What a call returns for the prepared gradient's `out` (`seeded`: a dy was given)."""
        # Everything per call that is not the prepared call itself costs far more in a loop than
        # alone: the prepared call's forward and backward sweep megabytes through the core's caches,
        # so this code and its data are fetched again on every call (under callgrind's cache model
        # `Model.gradient` missed a 512 KiB L2 1.65k times more per call than the prepared call, for
        # 68.6k more instructions, before the trims here brought that to 1.2k and 40k:
        # docs/benchmarks.md). Hence the work above is only what the call needs, and the views of
        # the values are made here, next to the conversions of y and the gradients.
        spec = self.spec
        for name, v in values.items():
            values[name] = read_only(v)
        if self.plain_out:
            y = out.y.numpy()
            grads = dict(zip(spec.xs, map(torch.Tensor.numpy, out.grads)))
        else:
            y = to_numpy(out.y)
            grads = {n: to_numpy(g) for n, g in zip(spec.xs, out.grads)}
        return result(spec=spec, y=y, grads=grads, disconnected=out.disconnected, seed="dy" if seeded else "ones",
                      device=self.device_label, dtype=self.dtype_label, values=values)


def result(**fields) -> GradientResult:
    """GradientResult(**fields) for all of its fields. The frozen dataclass's own __init__ sets them
    one `object.__setattr__` at a time: 3.4 µs more per call alone (timeit), more in the loop
    (above). The same object with the same fields, set in one update."""
    made = object.__new__(GradientResult)
    made.__dict__.update(fields)
    return made
