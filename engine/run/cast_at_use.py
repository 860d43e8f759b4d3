"""Constants cast where a step reads them, never held cast (`CAST_AT_USE`).

A cast copy would still live on through autograd: an op saves its inputs for its backward, and a
MatMul's saved weight is the copy. While a plan with such constants runs under grad mode,
`keeping_sources` packs any saved tensor that is (a view of) a cast copy as its source and the dtype,
and casts it again when the backward unpacks it: the backward holds one weight cast at a time."""
from __future__ import annotations

import contextlib
import dataclasses

import torch

_SOURCE = "_onnxgrad_cast_of"  # set on each cast copy: the constant it was cast from


# A float constant of at least this many elements stays in its own dtype (on the CPU, the model's
# memory-mapped bytes) in a plan of another float dtype, and is cast where a step reads it: a float64
# check of a float32 model would otherwise hold a float64 copy of every weight, a float16 run a float16
# one. Autograd keeps no cast copy either (below). Smaller ones are cast once, when the plan is built.
CAST_AT_USE = 1 << 16
# Ops that only pick or move elements of their first input: cast what they give, exactly the same.
CAST_AFTER = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Transpose", "Reshape", "Squeeze",
                        "Unsqueeze", "Flatten", "Identity"})


def foreign(value, dtype) -> bool:
    """A float constant of another float dtype than a plan's `dtype` (None: the model's own)."""
    return (dtype is not None and isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.dtype != dtype)


def converted(value, dtype):
    return value.to(dtype) if foreign(value, dtype) else value


def held_at_use(value, dtype) -> bool:
    """The plan keeps this constant as it is and casts it where a step reads it."""
    return foreign(value, dtype) and value.numel() >= CAST_AT_USE


def cast_where_read(step, cast_slots, dtype):
    """The argument positions a step casts; a Gather, Slice or view of a constant casts its output
    instead (the rows an embedding lookup takes, not the table), a MatMul or Gemm its B in blocks."""
    cast = tuple(j for j, s in enumerate(step.in_slots) if s in cast_slots)
    if not cast:
        return step
    if cast == (0,) and step.op_type in CAST_AFTER:
        return dataclasses.replace(step, fn=cast_after(step.fn, dtype))
    from . import cast_blocks  # lazy cycle: cast_blocks casts each block with cast_one, defined here

    step = dataclasses.replace(step, cast=cast)
    if cast_blocks.blocked(step):  # a MatMul or Gemm casts its B one block of columns at a time
        return dataclasses.replace(step, fn=cast_blocks.cast_in_blocks(step.fn, dtype),
                                   cast=tuple(j for j in cast if j != 1))
    return step


def cast_one(source, dtype: torch.dtype):
    if not isinstance(source, torch.Tensor) or source.dtype == dtype:
        return source
    copy = source.to(dtype)
    setattr(copy, _SOURCE, source)
    return copy


def cast_args(args: list, positions: tuple[int, ...], dtype: torch.dtype) -> list:
    if not positions:
        return args
    args = list(args)
    for j in positions:
        args[j] = cast_one(args[j], dtype)
    return args


def cast_after(fn, dtype: torch.dtype):
    """`fn` on the constant as it is, its float results cast: for ops that only pick or move elements."""
    def step(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(cast_one(o, dtype) if _float(o) else o for o in out)
        return cast_one(out, dtype) if _float(out) else out

    step.no_fold = True  # folded, its cast result would be held for good; at run time it is a view or a few rows
    step.__name__ = getattr(fn, "__name__", "step")
    return step


def _float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _pack(t: torch.Tensor):
    base = t if t._base is None else t._base
    source = getattr(base, _SOURCE, None)
    if source is None:
        return t
    return source, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), base is not t


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    source, dtype, shape, stride, offset, view = packed
    copy = source.to(dtype)
    return copy.as_strided(shape, stride, offset) if view else copy


def keeping_sources(active: bool):
    """Saved-tensor hooks for a run that casts constants at use under grad mode; a no-op otherwise."""
    if active and torch.is_grad_enabled():
        return torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
    return contextlib.nullcontext()
