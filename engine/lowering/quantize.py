"""Backward rule of DequantizeLinear (engine/ops/quantize.py): y = (x - zero_point) scale, with the scale
per tensor, per axis or per block; only the float scale has a gradient. (DynamicQuantizeLinear: the engine
treats its scale as a constant of x, see elementwise.piecewise_constant.)"""
from __future__ import annotations

import numpy as np

from .context import attr
from .registry import rule


def _layout(ctx, node, scale) -> str:
    shape = ctx.need_shape(scale)
    if len(shape) == 0 or int(np.prod(shape)) == 1:
        return "tensor"
    return "block" if attr(node, "block_size", 0) else "axis"


def _along(ctx, v, scale, x, layout, axis, block):
    """v (shaped like the scale) broadcastable against x, as the engine's _along."""
    rank = ctx.need_rank(x)
    if layout == "tensor":
        return ctx.op("Reshape", [v, ctx.ints([])])
    if layout == "axis":
        return ctx.op("Reshape", [v, ctx.ints([-1 if i == axis else 1 for i in range(rank)])])
    repeated = ctx.op("Unsqueeze", [v, ctx.ints([axis + 1])])
    whole = ctx.shape_from([ctx.dims(scale, 0, axis + 1), block, ctx.dims(scale, axis + 1)])
    merged = ctx.shape_from([ctx.dims(scale, 0, axis), -1, ctx.dims(scale, axis + 1)])
    spread = ctx.op("Reshape", [ctx.op("Expand", [repeated, whole]), merged])
    return ctx.op("Slice", [spread, ctx.ints([0]), ctx.dims(x, axis, axis + 1), ctx.ints([axis])])


@rule("DequantizeLinear")
def dequantize_linear(ctx, node, grads):
    g, x, scale = grads[0], node.input[0], node.input[1]
    zero_point = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if not ctx.wants(1):
        return [None, None, None]
    rank = ctx.need_rank(x)
    axis = attr(node, "axis", 1) % max(rank, 1)
    block = attr(node, "block_size", 0)
    layout = _layout(ctx, node, scale)
    centered = ctx.op("Cast", [x], to=ctx.elem(scale))
    if zero_point:
        zp = ctx.op("Cast", [zero_point], to=ctx.elem(scale))
        centered = ctx.op("Sub", [centered, _along(ctx, zp, scale, x, layout, axis, block)])
    if ctx.elem(node.output[0]) != ctx.elem(scale):  # output_dtype differs from the scale's
        g = ctx.op("Cast", [g], to=ctx.elem(scale))
    product = ctx.op("Mul", [g, centered])
    if layout == "tensor":
        dscale = ctx.op("Reshape", [ctx.op("ReduceSum", [product], keepdims=0), ctx.op("Shape", [scale])])
    elif layout == "axis":
        dscale = ctx.reduce_sum(product, [i for i in range(rank) if i != axis], keepdims=0)
    else:  # pad the axis to whole blocks, then sum each block
        whole = ctx.op("Mul", [ctx.dims(scale, axis, axis + 1), ctx.ints([block])])
        missing = ctx.op("Sub", [whole, ctx.dims(x, axis, axis + 1)])
        pads = ctx.op("Concat", [ctx.ints([0] * (rank + axis)), missing, ctx.ints([0] * (rank - axis - 1))], axis=0)
        padded = ctx.op("Pad", [product, pads])
        blocks = ctx.shape_from([ctx.dims(x, 0, axis), ctx.dims(scale, axis, axis + 1), block, ctx.dims(x, axis + 1)])
        dscale = ctx.op("ReduceSum", [ctx.op("Reshape", [padded, blocks]), ctx.ints([axis + 1])], keepdims=0)
    return [None, dscale, None]
