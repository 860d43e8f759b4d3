"""Values for tensors: parsing SPEC strings (CLI, explorer) and seeded random defaults."""
from __future__ import annotations

import os

import numpy as np
from onnx import helper

from .errors import FeedError
from .feed_syntax import SPEC_HELP
from .loader import GraphIndex


def declared_shape(graph: GraphIndex, name: str) -> tuple[int, ...]:
    """The declared shape with symbolic or unknown dims taken as 1; FeedError when the rank is unknown."""
    info = graph.types.get(name)
    if info is None or info.shape is None:
        raise FeedError(f"the shape of {name!r} is unknown; feed it a value ({SPEC_HELP} needs a shape, so use a .npy file)")
    return tuple(d if isinstance(d, int) and d > 0 else 1 for d in info.shape)


def declared_dtype(graph: GraphIndex, name: str) -> np.dtype:
    info = graph.types.get(name)
    if info is None or info.elem_type is None:
        return np.dtype(np.float32)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
    except Exception:
        return np.dtype(np.float32)


def random_value(graph: GraphIndex, name: str, seed: int) -> np.ndarray:
    """Standard-normal floats, or zeros for integer/bool tensors (random indices would be out of range)."""
    shape, dtype = declared_shape(graph, name), declared_dtype(graph, name)
    if dtype.kind == "f":
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def parse_spec(graph: GraphIndex, name: str, spec: str, default_seed: int = 0, label: str | None = None) -> np.ndarray:
    """One feed from its SPEC string; `label` names the value in errors (default: feed 'NAME')."""
    who = label or f"feed {name!r}"
    spec = spec.strip()
    if spec.endswith(".npy") or os.path.sep in spec:
        if not os.path.exists(spec):
            raise FeedError(f"{who}: no such file {spec}")
        _require_magic(spec, b"\x93NUMPY", f"{who}: {spec} is not an .npy file (write one with numpy.save)")
        try:
            return np.load(spec, allow_pickle=False)
        except Exception as exc:
            raise FeedError(f"{who}: cannot read {spec} as .npy: {exc}") from None
    try:
        shape, dtype = declared_shape(graph, name), declared_dtype(graph, name)
    except FeedError as exc:
        if label is None:
            raise
        raise FeedError(f"{label}: {exc}") from None
    if spec == "zeros":
        return np.zeros(shape, dtype)
    if spec == "ones":
        return np.ones(shape, dtype)
    if spec == "random" or spec.startswith("random:"):
        seed = default_seed
        if ":" in spec:
            try:
                seed = int(spec.split(":", 1)[1])
            except ValueError:
                raise FeedError(f"{who}: bad seed in {spec!r}; use random:SEED with an integer") from None
        if dtype.kind != "f":
            raise FeedError(f"{who}: random values need a float tensor, {name!r} is {dtype}")
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    try:
        number = float(spec)
    except ValueError:
        raise FeedError(f"{who}: cannot understand {spec!r}; use {SPEC_HELP}") from None
    return np.full(shape, number, dtype)


def _require_magic(path: str, magic: bytes, message: str) -> None:
    # numpy's own error for a text file is advice about pickles; say what the file is not instead.
    with open(path, "rb") as fh:
        if fh.read(len(magic)) != magic:
            raise FeedError(message)


def parse_assignment(text: str) -> tuple[str, str]:
    """NAME=SPEC -> (NAME, SPEC)."""
    if "=" not in text:
        raise FeedError(f"bad feed {text!r}: write NAME=SPEC, SPEC being {SPEC_HELP}")
    name, spec = text.split("=", 1)
    if not name.strip() or not spec.strip():
        raise FeedError(f"bad feed {text!r}: write NAME=SPEC, SPEC being {SPEC_HELP}")
    return name.strip(), spec.strip()


def load_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.exists(path):
        raise FeedError(f"no such file: {path}")
    _require_magic(path, b"PK", f"{path} is not an .npz file (write one with numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:
        raise FeedError(f"cannot read {path} as .npz: {exc}") from None
