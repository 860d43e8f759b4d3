"""Backward rules of engine/ops/pool.py: MaxPool by its own Indices, AveragePool by ConvTranspose."""
from __future__ import annotations

import numpy as np
from onnx import helper

from .context import attr
from .conv import geometry, transposed
from .registry import rule

POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides")


@rule("MaxPool")
def max_pool(ctx, node, grads):
    """Send each output's gradient to the input its maximum came from (ties: the first, as torch)."""
    if attr(node, "storage_order", 0):
        raise ctx.error("MaxPool with storage_order=1 is not lowered")
    g, x = grads[0], node.input[0]
    if len(node.output) > 1 and node.output[1]:
        indices = node.output[1]
    else:
        kept = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in POOL_ATTRS}
        _, indices = ctx.op("MaxPool", [x], n=2, **kept)
    flat = ctx.ints([-1])
    zeros = ctx.op("Reshape", [ctx.fill_like(x, 0.0), flat])
    # Indices count over the whole tensor (batch and channel included), so one flat scatter does it;
    # overlapping windows may pick the same input, hence reduction="add".
    scattered = ctx.op("ScatterElements", [zeros, ctx.op("Reshape", [indices, flat]), ctx.op("Reshape", [g, flat])],
                       axis=0, reduction="add")
    return [ctx.op("Reshape", [scattered, ctx.op("Shape", [x])])]


@rule("AveragePool")
def average_pool(ctx, node, grads):
    g, x, out = grads[0], node.input[0], node.output[0]
    sx, kernel, strides, dilations, begin, end = geometry(ctx, node, x)
    so = ctx.need_shape(out)
    if any(d != 1 for d in dilations):
        raise ctx.error("AveragePool with dilations is not lowered")
    floor_out = [(s + b + e - k) // st + 1 for s, b, e, k, st in zip(sx[2:], begin, end, kernel, strides)]
    if list(so[2:]) != floor_out:
        raise ctx.error("AveragePool whose ceil_mode adds windows past the padding is not lowered")
    np_type = helper.tensor_dtype_to_np_dtype(ctx.elem(x))
    window = ctx.const(np.ones([1, 1] + kernel, dtype=np_type))
    if attr(node, "count_include_pad", 0) or not any(begin + end):
        g = ctx.op("Div", [g, ctx.scalar(float(np.prod(kernel)), x)])
    else:  # each window averaged over its inputs inside the image only
        ones = ctx.const(np.ones([1, 1] + list(sx[2:]), dtype=np_type))
        counts = ctx.op("Conv", [ones, window], strides=strides, pads=begin + end)
        g = ctx.op("Div", [g, counts])
    planes = ctx.op("Reshape", [g, ctx.ints([sx[0] * sx[1], 1] + list(so[2:]))])
    plane_shape = (sx[0] * sx[1], 1) + tuple(sx[2:])
    back = transposed(ctx, planes, window, plane_shape, (sx[0] * sx[1], 1) + tuple(so[2:]), kernel, strides,
                      [1] * len(kernel), begin, end)
    return [ctx.op("Reshape", [back, ctx.ints(sx)])]


@rule("GlobalAveragePool")
def global_average_pool(ctx, node, grads):
    x, out = node.input[0], node.output[0]
    spread = ctx.op("Expand", [grads[0], ctx.op("Shape", [x])])
    return [ctx.op("Div", [spread, ctx.count_ratio(x, out)])]
