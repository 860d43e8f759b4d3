"""Backward rule of Gather (engine/ops/indexing.py): scatter-add the gradient back to the gathered rows."""
from __future__ import annotations

from .context import attr
from .registry import rule


@rule("Gather")
def gather(ctx, node, grads):
    """Rows picked twice receive both gradients: ScatterND with reduction="add" along the moved axis."""
    g, (data, indices) = grads[0], node.input[:2]
    rank, rank_idx = ctx.need_rank(data), ctx.need_rank(indices)
    axis = attr(node, "axis", 0) % rank
    size = ctx.op("Slice", [ctx.op("Shape", [data]), ctx.ints([axis]), ctx.ints([axis + 1])])
    negative = ctx.op("Cast", [ctx.op("Less", [indices, ctx.const(ctx.value_like(0, indices))])], to=ctx.elem(indices))
    wrapped = ctx.op("Add", [indices, ctx.op("Mul", [negative, ctx.op("Cast", [size], to=ctx.elem(indices))])])
    rows = ctx.op("Unsqueeze", [ctx.op("Cast", [wrapped], to=7), ctx.ints([-1])])  # int64 for ScatterND
    front = [axis] + [i for i in range(rank) if i != axis]  # gathered axis first
    # g is data.shape[:axis] + indices.shape + data.shape[axis + 1:]; bring the indices' axes first
    g_perm = list(range(axis, axis + rank_idx)) + list(range(axis)) + list(range(axis + rank_idx, rank + rank_idx - 1))
    moved = ctx.op("Transpose", [data], perm=front) if axis else data
    g_moved = ctx.op("Transpose", [g], perm=g_perm) if axis else g
    scattered = ctx.op("ScatterND", [ctx.fill_like(moved, 0.0), rows, g_moved], reduction="add")
    back = [front.index(i) for i in range(rank)]
    return [ctx.op("Transpose", [scattered], perm=back) if axis else scattered, None]
