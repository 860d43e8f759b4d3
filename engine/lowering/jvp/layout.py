"""Elementwise pieces of the tangent written so that onnxruntime keeps them in its blocked layout.

onnxruntime's CPU provider runs a float32 convolutional network in NCHWc (channels in blocks of 8 or
16): a Conv, its fused activation, and an Add or Mul of two same-shaped blocked tensors stay blocked,
but any other op, or an Add or Mul with a broadcast constant, reads the plain layout, and every such
read costs a reorder of the tensor out of the blocks and usually one back in (nchwc_transformer.cc).
A tangent full of `1 - y` and `x / 3` therefore reorders around every layer. Written as a 1×1
depthwise Conv (weight `scale`, bias `shift`), the same affine map stays blocked, and a HardSigmoid
after it is fused into that Conv. It is exact where it replaces one op (`scale` ±1 or a power of
two, or `shift` 0): the product is exact, and the sum is rounded once either way.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

BLOCK = 16  # the widest NCHWc block (AVX-512); a multiple of it is a multiple of every narrower one


def blocked(ctx, x: str) -> bool:
    """x is a float32 N×C×H×W tensor whose channel count onnxruntime's blocks divide."""
    info = ctx.types.get(x)  # the batch and image sizes may be symbolic: the channels are what counts
    shape = info.shape if info is not None else None
    return (ctx.elem(x) == TensorProto.FLOAT and shape is not None and len(shape) == 4
            and isinstance(shape[1], int) and shape[1] > 0 and shape[1] % BLOCK == 0)


def affine(ctx, x: str, scale: float, shift: float) -> str:
    """scale·x + shift elementwise, as a 1×1 depthwise Conv where x is `blocked`, else Mul and Add."""
    if blocked(ctx, x):
        channels = ctx.types[x].shape[1]
        inputs = [x, ctx.const(np.full((channels, 1, 1, 1), scale, np.float32))]
        if shift:
            inputs.append(ctx.const(np.full((channels,), shift, np.float32)))
        out = ctx.op("Conv", inputs, group=channels)
    elif scale == -1.0 and shift:
        out = ctx.op("Sub", [ctx.scalar(shift, x), x])
    else:
        out = x if scale == 1.0 else ctx.op("Mul", [x, ctx.scalar(scale, x)])
        if shift:
            out = ctx.op("Add", [out, ctx.scalar(shift, x)])
    if x in ctx.types:
        ctx.types[out] = ctx.types[x]
    return out
