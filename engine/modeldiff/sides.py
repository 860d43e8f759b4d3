"""The two sides of a diff: A (always an engine Model) and B (another Model, the same Model run in a
half dtype, or onnxruntime on the same file), and the one set of feeds both are given."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import DiffError

HALF = ("float16", "bfloat16")
AGAINST = ("onnxruntime",)


@dataclass
class Sides:
    a: object  # engine Model
    b: object | None  # engine Model; None for onnxruntime
    label_a: str
    label_b: str
    mode: str  # "models", "dtype" or "onnxruntime"
    b_dtype: str | None = None
    source: object = None  # what A was loaded from (onnxruntime reads it again)


def label_of(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) and name else "<model>"


def as_model(source):
    from .. import load
    from ..model import Model

    return source if isinstance(source, Model) else load(source)


def open_sides(a, b=None, *, dtype=None, against=None) -> Sides:
    """Check the form asked for (two models; one with dtype; one against onnxruntime) and load."""
    check_form(b is not None, dtype, against)
    model_a = as_model(a)
    label = label_of(a)
    if dtype:
        return Sides(model_a, model_a, label, f"{label} as {dtype}", "dtype", dtype, a)
    if against:
        return Sides(model_a, None, label, "onnxruntime", "onnxruntime", None, a)
    return Sides(model_a, as_model(b), label, label_of(b), "models", None, b)


def check_form(two: bool, dtype=None, against=None) -> None:
    """DiffError unless exactly one of: a second model, a half dtype, against onnxruntime."""
    if dtype is not None and dtype not in HALF:
        raise DiffError(f"dtype {dtype!r} is not a half type diff runs a model in: choose {', '.join(HALF)}")
    if against is not None and against not in AGAINST:
        raise DiffError(f"cannot diff against {against!r}: choose {', '.join(AGAINST)}")
    if two and (dtype or against):
        which = f"dtype {dtype}" if dtype else f"against {against}"
        raise DiffError(f"{which} compares one model with itself: give one model, not two")
    if dtype and against:
        raise DiffError("give either a dtype or against onnxruntime, not both")
    if not two and not (dtype or against):
        raise DiffError("diff needs a second model, a dtype (float16, bfloat16) or against onnxruntime")


def make_feeds(model, feeds, *, y=None, xs=(), zs=(), dims=None, past=None, seed=0):
    """The feeds both sides get: the given ones plus the engine's defaults for whatever else computing
    y (or every output) reads, made up once so an LLM's feeds agree with each other. Returns
    (feeds, targets, spec, notes)."""
    from ..gradient.dims import check_dims
    from ..gradient.feeds import complete_feeds
    from ..gradient.past_feeds import with_past

    if y is not None and not model.graph.has_tensor(y):
        from ..errors import SelectionError

        raise SelectionError(f"y {y!r} is not a tensor of A{model.graph.did_you_mean(y)}")
    spec = model.selection(y, list(xs), list(zs)) if y is not None and xs else None
    dims = with_past(model.graph, check_dims(model.graph, dict(dims or {})), past)
    targets = list(dict.fromkeys(([y] if y else []) + list(model.outputs)))
    members = list(spec.xs) + list(spec.zs) if spec is not None else []
    feeds, chosen = complete_feeds(model, dict(feeds or {}), targets=targets, members=members, seed=seed,
                                   dims=dims)
    return feeds, targets, spec, tuple(d.note for d in chosen)
