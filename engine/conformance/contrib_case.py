"""One generated com.microsoft case (`ContribCase`) and the helpers every case family builds it with."""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..modelfile.contrib_schema import signature

MS = "com.microsoft"


@dataclass(frozen=True)
class ContribCase:
    """One generated node: inputs by formal name (None = omitted optional input), in schema order."""

    op: str
    label: str
    inputs: tuple
    attrs: tuple = ()
    outputs: tuple = ("output",)  # formal output names, in order (a prefix of the schema's)
    xs: tuple = ()  # inputs whose gradient is checked against finite differences
    domain: str = MS
    opset: int = 17  # the default domain's opset in the case's model
    half: bool = True  # also run a float16 variant
    reference: Callable | None = None  # builds the oracle model when onnxruntime has no CPU kernel
    straight_through: tuple = ()  # xs whose backward is a documented straight-through estimate

    @property
    def name(self) -> str:
        return f"{self.op}/{self.label}"

    def feeds(self, dtype: str = "float32") -> dict:
        out = {}
        for name, value in self.inputs:
            if value is None:
                continue
            if dtype == "float16" and value.dtype == np.float32:
                value = value.astype(np.float16)
            out[name] = value
        return out


def rng_for(op: str):
    return np.random.default_rng(zlib.crc32(op.encode()))


def normal(rng, *shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def make(op, label, values: dict, attrs=None, n_outputs=1, xs=None, domain=MS, **kw) -> ContribCase:
    names, outs = signature(domain, op)
    inputs = [(n, values.get(n)) for n in names]
    while inputs and inputs[-1][1] is None:
        inputs.pop()
    if xs is None:
        xs = [n for n, v in inputs if v is not None and v.dtype == np.float32]
    attrs = tuple(sorted((attrs or {}).items()))
    return ContribCase(op, label, tuple(inputs), attrs, tuple(outs[:n_outputs]), tuple(xs), domain, **kw)
