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
    axis = attr(node, "axis")
    shapes = [ctx.shape(t) for t in inputs]
    if all(s is not None for s in shapes):
        axis %= len(shapes[0])
        sizes = [s[axis] for s in shapes]
        parts = ctx.op("Split", [g, ctx.ints(sizes)], n=len(inputs), axis=axis) if len(inputs) > 1 else [g]
        return [p if ctx.wants(i) else None for i, p in enumerate(parts)]
    out, start = [], ctx.ints([0])
    for i, t in enumerate(inputs):  # a negative axis indexes the shape and the slice alike
        size = ctx.op("Gather", [ctx.op("Shape", [t]), ctx.ints([axis])], axis=0)
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
    """Zeros around the slice: a Pad for constant unit-step slices of a static shape; otherwise (run-time
    starts or ends, any steps, unknown shapes) g scattered to the positions the same Slice picks."""
    x = node.input[0]
    operands = [node.input[i] if len(node.input) > i else "" for i in range(1, 5)]
    static = ctx.shape(x)
    values = [ctx.value(t) if t else None for t in operands]
    if static is None or any(t and v is None for t, v in zip(operands, values)) or \
            (values[3] is not None and any(int(v) != 1 for v in values[3].reshape(-1))):
        return [ctx.scatter_back(grads[0], x, ctx.op("Slice", [ctx.positions(x)] + list(node.input[1:])))] + \
            [None] * (len(node.input) - 1)
    rank = len(static)
    starts, ends = ([int(v) for v in values[k].reshape(-1)] for k in (0, 1))
    axes = [int(a) % rank for a in values[2].reshape(-1)] if values[2] is not None else list(range(len(starts)))
    before, after = [0] * rank, [0] * rank
    for a, s, e in zip(axes, starts, ends):
        size = static[a]
        s = min(max(s + size if s < 0 else s, 0), size)
        e = min(max(e + size if e < 0 else e, 0), size)
        before[a], after[a] = s, size - max(e, s)
    return [ctx.op("Pad", [grads[0], ctx.ints(before + after)])]


@rule("Pad")
def pad(ctx, node, grads):
    """constant: the adjoint crops what was added (a Pad by -pads, which also restores what a negative pad
    cropped); reflect, edge, wrap: g added up at the positions the same Pad copies from."""
    x, g = node.input[0], grads[0]
    pads = node.input[1]
    axes = [node.input[3]] if len(node.input) > 3 and node.input[3] else []
    if (attr(node, "mode", "constant") or "constant") == "constant":
        dx = ctx.op("Pad", [g, ctx.op("Neg", [pads])] + ([""] + axes if axes else []), mode="constant")
        value = node.input[2] if len(node.input) > 2 else ""
        if not ctx.wants(2) or not value:
            return [dx]
        # constant_value fills every output element that no input element lands on
        filled = ctx.op("Sub", [ctx.op("ReduceSum", [g], keepdims=0), ctx.op("ReduceSum", [dx], keepdims=0)])
        return [dx if ctx.wants(0) else None, None, ctx.op("Reshape", [filled, ctx.op("Shape", [value])])]
    rest = list(node.input[1:2]) + ([""] + axes if axes else [])
    return [ctx.scatter_back(g, x, ctx.op("Pad", [ctx.positions(x)] + rest, mode=attr(node, "mode")))]


@rule("Tile")
def tile(ctx, node, grads):
    """Output axis k is repeats[k] copies of the input axis: view g as (r0, d0, r1, d1, ...), sum the r's."""
    x, repeats = node.input[:2]
    rank = ctx.need_rank(x)
    pairs = ctx.op("Concat", [ctx.op("Unsqueeze", [repeats, ctx.ints([1])]),
                              ctx.op("Unsqueeze", [ctx.op("Shape", [x]), ctx.ints([1])])], axis=1)
    split = ctx.op("Reshape", [grads[0], ctx.op("Reshape", [pairs, ctx.ints([-1])])])
    return [ctx.op("ReduceSum", [split, ctx.ints(range(0, 2 * rank, 2))], keepdims=0), None]


def _block_views(ctx, x, b: int, op_type: str, mode: str):
    """(6-D view, perm) of DepthToSpace / SpaceToDepth as Reshape -> Transpose -> Reshape on x."""
    n, c, h, w = (ctx.dims(x, i, i + 1) for i in range(4))
    if op_type == "SpaceToDepth":
        h_b, w_b = (ctx.op("Div", [d, ctx.ints([b])]) for d in (h, w))
        return ctx.shape_from([n, c, h_b, b, w_b, b]), [0, 1, 3, 5, 2, 4] if mode == "CRD" else [0, 3, 5, 1, 2, 4]
    c_b = ctx.op("Div", [c, ctx.ints([b * b])])
    if mode == "CRD":
        return ctx.shape_from([n, c_b, b, b, h, w]), [0, 1, 4, 2, 5, 3]
    return ctx.shape_from([n, b, b, c_b, h, w]), [0, 3, 4, 1, 5, 2]


@rule("DepthToSpace", "SpaceToDepth")
def depth_space(ctx, node, grads):
    """A fixed permutation of elements; its adjoint is the inverse permutation of the same 6-D view."""
    x = node.input[0]
    view, perm = _block_views(ctx, x, attr(node, "blocksize"), node.op_type, attr(node, "mode", "DCR"))
    moved = ctx.op("Gather", [view, ctx.ints(perm)], axis=0)  # the view's shape after the transpose
    inverse = [int(i) for i in np.argsort(perm)]
    back = ctx.op("Transpose", [ctx.op("Reshape", [grads[0], moved])], perm=inverse)
    return [ctx.op("Reshape", [back, ctx.op("Shape", [x])])]


@rule("ReverseSequence")
def reverse_sequence(ctx, node, grads):
    """An involution: reversing g's sequences again sends each element back."""
    kept = {k: attr(node, k) for k in ("batch_axis", "time_axis") if attr(node, k) is not None}
    return [ctx.op("ReverseSequence", [grads[0], node.input[1]], **kept), None]


@rule("Compress")
def compress(ctx, node, grads):
    """Compress is a Gather of the positions where the condition holds (over the flattened input
    without an axis): g scattered back to them."""
    x, cond = node.input[:2]
    picked = ctx.op("Squeeze", [ctx.op("NonZero", [cond]), ctx.ints([0])])
    axis = attr(node, "axis")
    source = ctx.positions(x)
    if axis is None:
        source = ctx.op("Reshape", [source, ctx.ints([-1])])
        axis = 0
    return [ctx.scatter_back(grads[0], x, ctx.op("Gather", [source, picked], axis=axis)), None]


@rule("Range")
def range_(ctx, node, grads):
    """Element i is start + i delta: d start = sum g, d delta = sum i g, the limit only sets the length."""
    g, delta = grads[0], node.input[2]
    out = [None, None, None]
    if ctx.wants(0):
        out[0] = ctx.op("ReduceSum", [g], keepdims=0)
    if ctx.wants(2):
        steps = ctx.op("Range", [ctx.const(np.asarray(0, np.int64)), ctx.op("Size", [g]), ctx.const(np.asarray(1, np.int64))])
        out[2] = ctx.op("ReduceSum", [ctx.op("Mul", [g, ctx.op("Cast", [steps], to=ctx.elem(delta))])], keepdims=0)
    return out


@rule("Trilu")
def trilu(ctx, node, grads):
    """A mask: g through the same triangle."""
    k = [node.input[1]] if len(node.input) > 1 and node.input[1] else []
    return [ctx.op("Trilu", [grads[0]] + k, upper=attr(node, "upper", 1)), None]


@rule("OneHot")
def one_hot(ctx, node, grads):
    """y = values[1] where hot, values[0] elsewhere: each value gets the sum of g over its cells."""
    g, (indices, depth, values) = grads[0], node.input
    if not ctx.wants(2):
        return [None, None, None]
    picked = ctx.op("OneHot", [indices, depth, ctx.const(np.array([0.0, 1.0], np.float32))], axis=attr(node, "axis", -1))
    hot = ctx.op("ReduceSum", [ctx.op("Mul", [g, ctx.op("Cast", [picked], to=ctx.elem(values))])], keepdims=0)
    total = ctx.op("ReduceSum", [g], keepdims=0)
    both = ctx.op("Concat", [ctx.op("Unsqueeze", [t, ctx.ints([0])]) for t in (ctx.op("Sub", [total, hot]), hot)], axis=0)
    return [None, None, both]
