"""Backward rule of Gather (engine/ops/indexing.py): scatter-add the gradient back to the gathered rows."""
from __future__ import annotations

import numpy as np

from .context import attr
from .registry import refuse, rule

refuse("its gradient (each unique value's, back to its first occurrence) is not lowered", "Unique")


@rule("Gather")
def gather(ctx, node, grads):
    """Rows picked twice receive both gradients: ScatterND with reduction="add" along the moved axis."""
    g, (data, indices) = grads[0], node.input[:2]
    rank, rank_idx = ctx.need_rank(data), ctx.need_rank(indices)
    axis = attr(node, "axis", 0) % rank
    size = ctx.op("Gather", [ctx.op("Shape", [data]), ctx.const(np.asarray(axis, np.int64))], axis=0)  # a scalar
    negative = ctx.op("Cast", [ctx.op("Less", [indices, ctx.const(ctx.value_like(0, indices))])], to=ctx.elem(indices))
    wrapped = ctx.op("Add", [indices, ctx.op("Mul", [negative, ctx.op("Cast", [size], to=ctx.elem(indices))])])
    rows = ctx.op("Unsqueeze", [ctx.op("Cast", [wrapped], to=7), ctx.ints([-1])])  # int64 for ScatterND
    front = [axis] + [i for i in range(rank) if i != axis]  # gathered axis first
    # g is data.shape[:axis] + indices.shape + data.shape[axis + 1:]; bring the indices' axes first
    g_perm = list(range(axis, axis + rank_idx)) + list(range(axis)) + list(range(axis + rank_idx, rank + rank_idx - 1))
    moved = ctx.op("Transpose", [data], perm=front) if axis else data
    g_moved = ctx.op("Transpose", [g], perm=g_perm) if axis else g
    scattered = ctx.scatter_add("ScatterND", ctx.op("Shape", [moved]), rows, g_moved, data)
    back = [front.index(i) for i in range(rank)]
    return [ctx.op("Transpose", [scattered], perm=back) if axis else scattered, None]


@rule("GatherElements")
def gather_elements(ctx, node, grads):
    """Positions picked twice receive both gradients: ScatterElements with reduction="add"."""
    data, indices = node.input[:2]
    return [ctx.scatter_add("ScatterElements", ctx.op("Shape", [data]), indices, grads[0], data,
                            axis=attr(node, "axis", 0)), None]


@rule("GatherND")
def gather_nd(ctx, node, grads):
    if attr(node, "batch_dims", 0):
        raise ctx.error("GatherND with batch_dims > 0 is not lowered")
    data, indices = node.input[:2]
    return [ctx.scatter_add("ScatterND", ctx.op("Shape", [data]), indices, grads[0], data), None]


@rule("MaxUnpool")
def max_unpool(ctx, node, grads):
    """Each input element went to the flat position its index names in the output MaxUnpool infers
    (an output_shape only pads it at the end): gather g back from there."""
    x, indices = node.input[:2]
    g = grads[0]
    if len(node.input) > 2 and node.input[2]:
        n = len(attr(node, "kernel_shape"))
        strides, pads = attr(node, "strides", [1] * n), attr(node, "pads", [0] * 2 * n)
        inferred = [ctx.dims(x, 0, 2)]
        for i, k in enumerate(attr(node, "kernel_shape")):
            size = ctx.op("Mul", [ctx.op("Sub", [ctx.dims(x, 2 + i, 3 + i), ctx.ints([1])]), ctx.ints([strides[i]])])
            inferred.append(ctx.op("Add", [size, ctx.ints([k - pads[i] - pads[n + i]])]))
        g = ctx.op("Slice", [g, ctx.ints([0] * (n + 2)), ctx.shape_from(inferred)])
    flat = ctx.ints([-1])
    picked = ctx.op("Gather", [ctx.op("Reshape", [g, flat]), ctx.op("Reshape", [indices, flat])], axis=0)
    return [ctx.op("Reshape", [picked, ctx.op("Shape", [x])])] + [None] * (len(node.input) - 1)


@rule("ScatterElements", "Scatter", "ScatterND")
def scatter(ctx, node, grads):
    """none: positions written get no gradient in data, each update gets g where it was written (as torch);
    add: data gets g; mul, max, min: each factor / extreme gets its share, as in ReduceProd / ReduceMax."""
    g, (data, indices, updates) = grads[0], node.input
    nd = node.op_type == "ScatterND"
    kind = {} if nd else {"axis": attr(node, "axis", 0)}

    def put(base, values, reduction="none"):
        return ctx.op("ScatterND" if nd else "ScatterElements", [base, indices, values], reduction=reduction, **kind)

    def take(t):
        return ctx.op("GatherND" if nd else "GatherElements", [t, indices], **kind)

    reduction = attr(node, "reduction", "none")
    if reduction in ("none", "add"):
        ddata = g if reduction == "add" else put(g, ctx.fill_like(updates, 0.0))
        return [ddata if ctx.wants(0) else None, None, take(g) if ctx.wants(2) else None]
    out, zero, one = node.output[0], ctx.scalar(0.0, data), ctx.scalar(1.0, data)

    def as_float(cond):
        return ctx.op("Cast", [cond], to=ctx.elem(data))

    if reduction in ("max", "min"):  # ties, the original value included, share the gradient evenly
        data_hit, update_hit = ctx.op("Equal", [data, out]), ctx.op("Equal", [updates, take(out)])
        counts = put(as_float(data_hit), as_float(update_hit), "add")
        share = ctx.op("Div", [g, ctx.op("Max", [counts, one])])  # never 0/0, whatever Equal says
        return [ctx.op("Where", [data_hit, share, zero]) if ctx.wants(0) else None, None,
                ctx.op("Where", [update_hit, take(share), zero]) if ctx.wants(2) else None]
    # mul: a factor x of a product p gets p / x, exactly with zeros (counted as in ReduceProd)
    data_zero, update_zero = ctx.op("Equal", [data, zero]), ctx.op("Equal", [updates, zero])
    data_nz, update_nz = ctx.op("Where", [data_zero, one, data]), ctx.op("Where", [update_zero, one, updates])
    rest = ctx.op("Mul", [g, put(data_nz, update_nz, "mul")])
    zeros = put(as_float(data_zero), as_float(update_zero), "add")

    def share(is_zero, nonzero, at):
        lone = ctx.op("Where", [ctx.op("Equal", [at(zeros), one]), at(rest), zero])
        none = ctx.op("Where", [ctx.op("Equal", [at(zeros), zero]), ctx.op("Div", [at(rest), nonzero]), zero])
        return ctx.op("Where", [is_zero, lone, none])

    return [share(data_zero, data_nz, lambda t: t) if ctx.wants(0) else None, None,
            share(update_zero, update_nz, take) if ctx.wants(2) else None]


@rule("TensorScatter")
def tensor_scatter(ctx, node, grads):
    """present = past with update written at write_indices[b] + i along the axis (modulo its length when
    circular): past gets g except where written, update gets g gathered from where it went."""
    g, past, update = grads[0], node.input[0], node.input[1]
    write = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    rank = ctx.need_rank(past)
    axis = attr(node, "axis", -2) % rank
    length = ctx.op("Squeeze", [ctx.dims(update, axis, axis + 1), ctx.ints([0])])
    steps = ctx.op("Range", [ctx.const(np.asarray(0, np.int64)), length, ctx.const(np.asarray(1, np.int64))])
    starts = ctx.op("Cast", [write], to=7) if write else ctx.const(np.zeros(1, np.int64))
    where = ctx.op("Add", [ctx.op("Unsqueeze", [starts, ctx.ints([1])]), ctx.op("Unsqueeze", [steps, ctx.ints([0])])])
    if attr(node, "mode", "linear") == "circular":
        where = ctx.op("Mod", [where, ctx.dims(past, axis, axis + 1)])
    # (batch, length) positions viewed as (batch, 1, .., length at the axis, .., 1), spread over update
    view = ctx.shape_from([-1] + [ctx.dims(update, axis, axis + 1) if i == axis else 1 for i in range(1, rank)])
    index = ctx.op("Expand", [ctx.op("Reshape", [where, view]), ctx.op("Shape", [update])])
    out = [None, None, None]
    if ctx.wants(0):
        out[0] = ctx.op("ScatterElements", [g, index, ctx.fill_like(update, 0.0)], axis=axis)
    if ctx.wants(1):
        out[1] = ctx.op("GatherElements", [g, index], axis=axis)
    return out
