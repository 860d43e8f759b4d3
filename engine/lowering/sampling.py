"""Backward rules of engine/ops/sampling.py. GridSample (for a fixed grid) and Col2Im are linear in their
input, y = A x; the adjoint A^T g comes from running the same op on an identity basis (which yields A,
every mode, padding and alignment included) and one MatMul. A holds (input size) x (output size) values
per batch item, so it is built only below a size cap. DeformConv and RoiAlign are refused."""
from __future__ import annotations

import numpy as np
from onnx import helper

from .registry import refuse, rule

BASIS_CAP = 1 << 25  # values of A (per batch item for GridSample)

refuse("its gradients with respect to the offsets and mask are bilinear-sampling derivatives, not lowered", "DeformConv")
refuse("its gradient with respect to the regions (rois) is not lowered", "RoiAlign")


def _size(ctx, t, start=0):
    info = ctx.types.get(t)
    if info is None or info.shape is None or None in info.shape[start:]:
        return None
    return int(np.prod(info.shape[start:], dtype=np.int64))


def _check_cap(ctx, a: int | None, b: int | None) -> None:
    if a is None or b is None:
        raise ctx.error("needs static sizes to bound its basis (input size x output size)")
    if a * b > BASIS_CAP:
        raise ctx.error(f"its basis would hold {a * b} values (more than {BASIS_CAP})")


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _eye(ctx, n: str, like: str) -> str:
    """The n x n identity in like's element type (n: a 1-element int64 tensor)."""
    square = ctx.op("Concat", [n, n], axis=0)
    return ctx.op("EyeLike", [ctx.op("ConstantOfShape", [square], value=ctx.tensor_like(1.0, like))])


@rule("GridSample")
def grid_sample(ctx, node, grads):
    """y[n, c] = A_n x[n, c] with A_n fixed by the grid: A_n from GridSample on the one-hot images."""
    if ctx.wants(1):
        raise ctx.error("the gradient with respect to the grid is not lowered")
    g, (x, grid), y = grads[0], node.input[:2], node.output[0]
    _check_cap(ctx, _size(ctx, x, 2), _size(ctx, y, 2))
    pixels = ctx.op("ReduceProd", [ctx.dims(x, 2)], keepdims=1)
    basis = ctx.op("Reshape", [_eye(ctx, pixels, x), ctx.shape_from([1, pixels, ctx.dims(x, 2)])])
    basis = ctx.op("Expand", [basis, ctx.shape_from([ctx.dims(x, 0, 1), pixels, ctx.dims(x, 2)])])
    sampled = ctx.op("GridSample", [basis, grid], **_attrs(node))
    flat = ctx.op("Reshape", [sampled, ctx.ints([0, 0, -1])])  # [N, pixels, outputs]
    g_flat = ctx.op("Reshape", [g, ctx.ints([0, 0, -1])])  # [N, C, outputs]
    dx = ctx.op("MatMul", [g_flat, ctx.op("Transpose", [flat], perm=[0, 2, 1])])
    return [ctx.op("Reshape", [dx, ctx.op("Shape", [x])]), None]


@rule("Col2Im")
def col2im(ctx, node, grads):
    """Col2Im adds each column's patch into the image: y = A x, A from Col2Im on the unit columns."""
    g, (x, image_shape, block_shape) = grads[0], node.input[:3]
    _check_cap(ctx, _size(ctx, x, 1), _size(ctx, node.output[0], 1))
    columns = ctx.op("ReduceProd", [ctx.dims(x, 1)], keepdims=1)
    basis = ctx.op("Reshape", [_eye(ctx, columns, x), ctx.shape_from([columns, ctx.dims(x, 1)])])
    images = ctx.op("Col2Im", [basis, image_shape, block_shape], **_attrs(node))
    flat = ctx.op("Reshape", [images, ctx.shape_from([columns, -1])])  # [columns, C * pixels]
    g_flat = ctx.op("Reshape", [g, ctx.ints([0, -1])])  # [N, C * pixels]
    dx = ctx.op("MatMul", [g_flat, ctx.op("Transpose", [flat], perm=[1, 0])])
    return [ctx.op("Reshape", [dx, ctx.op("Shape", [x])]), None, None]
