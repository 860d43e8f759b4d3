"""Backward rules of engine/ops/shape.py: reshapes, Transpose, Concat, Split, Expand."""
from __future__ import annotations

import numpy as np

from .context import attr
from .registry import rule


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(ctx, node, grads):
    return [ctx.op("Reshape", [grads[0], ctx.op("Shape", [node.input[0]])])]


@rule("Transpose")
def transpose(ctx, node, grads):
    perm = attr(node, "perm") or list(reversed(range(ctx.need_rank(node.input[0]))))
    return [ctx.op("Transpose", [grads[0]], perm=[int(i) for i in np.argsort(perm)])]


@rule("Expand")
def expand(ctx, node, grads):
    return [ctx.unbroadcast(grads[0], node.input[0], node.output[0])]


@rule("Concat")
def concat(ctx, node, grads):
    """Each input's slice of g along the axis; static sizes give one Split, unknown ones Slices."""
    g, inputs = grads[0], list(node.input)
    axis = attr(node, "axis") % ctx.need_rank(inputs[0])
    shapes = [ctx.shape(t) for t in inputs]
    if all(s is not None for s in shapes):
        sizes = [s[axis] for s in shapes]
        parts = ctx.op("Split", [g, ctx.ints(sizes)], n=len(inputs), axis=axis) if len(inputs) > 1 else [g]
        return [p if ctx.wants(i) else None for i, p in enumerate(parts if len(inputs) > 1 else [g])]
    out, start = [], ctx.ints([0])
    for i, t in enumerate(inputs):
        size = ctx.op("Slice", [ctx.op("Shape", [t]), ctx.ints([axis]), ctx.ints([axis + 1])])
        stop = ctx.op("Add", [start, size])
        out.append(ctx.op("Slice", [g, start, stop, ctx.ints([axis])]) if ctx.wants(i) else None)
        start = stop
    return out


@rule("Split")
def split(ctx, node, grads):
    """Concatenate the outputs' gradients, zeros for outputs nobody differentiated."""
    parts = [g if g is not None else ctx.fill_like(o, 0.0) for g, o in zip(grads, node.output)]
    axis = attr(node, "axis", 0)
    return [ctx.op("Concat", parts, axis=axis) if len(parts) > 1 else parts[0]]


@rule("Slice")
def slice_(ctx, node, grads):
    """Zeros around the slice: a Pad, for constant starts/ends/axes and unit steps."""
    x = node.input[0]
    sx = ctx.need_shape(x)
    rank = len(sx)

    def operand(i, default):
        return [int(v) for v in ctx.need_value(node.input[i]).reshape(-1)] if len(node.input) > i and node.input[i] \
            else default

    starts, ends = operand(1, None), operand(2, None)
    axes = [a % rank for a in operand(3, list(range(len(starts))))]
    steps = operand(4, [1] * len(starts))
    if any(s != 1 for s in steps):
        raise ctx.error("Slice with steps other than 1 is not lowered")
    before, after = [0] * rank, [0] * rank
    for a, s, e in zip(axes, starts, ends):
        size = sx[a]
        s = min(max(s + size if s < 0 else s, 0), size)
        e = min(max(e + size if e < 0 else e, 0), size)
        before[a], after[a] = s, size - max(e, s)
    return [ctx.op("Pad", [grads[0], ctx.ints(before + after)])]
