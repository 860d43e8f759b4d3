"""What an op's validator (`@validates`, engine/registry.py) reads: the node's inputs by schema name,
and the one-line refusals it raises. The plan names the node in front of each line:
`node 'attn' (GroupQueryAttention): input 'past_key' of shape [1, 2, 6, 1]: dim 3 is 1, expected 16 (...)`.

A validator mirrors the checks onnxruntime's kernel makes before it computes (its `CheckInputs`
helpers), and no more: a model onnxruntime runs must pass.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import BadAttributeError, InputShapeError


class Inputs:
    """A node's input values (torch tensors, None where omitted) by schema name."""

    __slots__ = ("_index", "_values", "read_values")

    def __init__(self, index: Mapping[str, int], values: Sequence):
        self._index, self._values = index, values
        self.read_values = False  # set by `value`: the verdict then depends on more than shapes and dtypes

    def __getitem__(self, name: str):
        i = self._index[name]
        return self._values[i] if i < len(self._values) else None

    def __contains__(self, name: str) -> bool:
        """Whether the op's schema has an input `name` (given or not)."""
        return name in self._index

    @property
    def names(self) -> tuple[str, ...]:
        """The schema's input names, in order."""
        return tuple(self._index)

    def given(self, name: str) -> bool:
        return self[name] is not None

    def shape(self, name: str) -> tuple[int, ...] | None:
        t = self[name]
        return None if t is None else tuple(t.shape)

    def fail(self, name: str, what: str):
        """Raise the one line: input `name` (with its shape) and what is wrong with it."""
        t = self[name]
        shape = "" if t is None or not hasattr(t, "shape") else f" of shape {list(t.shape)}"
        raise InputShapeError(f"input {name!r}{shape}: {what}")

    def rank(self, name: str, *ranks: int, layout: str = "") -> tuple[int, ...]:
        """`name`'s shape, refused unless it has one of `ranks` dims; `layout` says what they are."""
        shape = self.shape(name)
        if shape is not None and len(shape) not in ranks:
            want = " or ".join(map(str, ranks))
            self.fail(name, f"has {len(shape)} dims, expected {want}{f' ({layout})' if layout else ''}")
        return shape

    def dim(self, name: str, axis: int, expected: int, why: str) -> None:
        """Refuse `name` unless dim `axis` (negative from the end) is `expected`; `why` says whence."""
        shape = self.shape(name)
        if shape is not None and shape[axis] != expected:
            self.fail(name, f"dim {axis % len(shape)} is {shape[axis]}, expected {expected} ({why})")

    def width(self, name: str, expected: int, why: str) -> None:
        """Refuse `name` unless it is 1-D of `expected` elements (a bias, gamma, beta)."""
        shape = self.shape(name)
        if shape is not None and shape != (expected,):
            self.fail(name, f"expected shape [{expected}] ({why})")

    def dtype(self, name: str, *allowed) -> None:
        t = self[name]
        if t is not None and t.dtype not in allowed:
            names = " or ".join(str(d).replace("torch.", "") for d in allowed)
            self.fail(name, f"has type {str(t.dtype).replace('torch.', '')}, expected {names}")

    def broadcasts(self, name: str, target: Sequence[int], why: str) -> None:
        """Refuse `name` unless it broadcasts to `target` (numpy's rule) without changing it."""
        shape = self.shape(name)
        if shape is not None and (len(shape) > len(target) or any(
                s not in (1, t) for s, t in zip(reversed(shape), reversed(target)))):
            self.fail(name, f"does not broadcast to {list(target)} ({why})")

    def value(self, name: str) -> int:
        """The first element of a small integer input (total_sequence_length), as a Python int."""
        self.read_values = True
        return int(self[name].reshape(-1)[0])


def bad_attribute(name: str, value, expected: str):
    """Raise the one line for an attribute the op refuses (`expected` says what it takes)."""
    raise BadAttributeError(f"attribute {name!r} is {value}, expected {expected}")
