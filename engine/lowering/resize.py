"""Backward rule of Resize (engine/ops/resize.py): Resize is linear in X and interpolates each axis
apart, so its adjoint multiplies g, axis by axis, by the transpose of that axis's 1-D interpolation
matrix. The matrix is the same Resize (mode, coordinate transformation, cubic coefficient, antialias,
nearest rounding all kept) applied at run time to an identity (nearest mode: to a row of positions):
scales, sizes and roi may be run-time values and the shapes symbolic (no size is needed while lowering).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .context import attr
from .registry import rewritten, rule

rewritten("onnx's version converter writes it as Resize (models below opset 17 are converted first)", "Upsample")

BASIS_ATTRS = ("antialias", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside", "mode",
               "nearest_mode")


def _operand(node, i: int) -> str:
    return node.input[i] if len(node.input) > i and node.input[i] else ""


def _is_identity(ctx, node, k: int, scales: str, sizes: str, x: str, axis: int) -> bool:
    """Whether axis k (the node's k-th resized axis) is known to keep its size and values."""
    transform = attr(node, "coordinate_transformation_mode", "half_pixel")
    if transform == "tf_crop_and_resize" or transform == "tf_half_pixel_for_nn":  # the latter shifts at scale 1
        return False
    s, z, shape = ctx.value(scales), ctx.value(sizes), ctx.shape(x)
    if scales and s is not None and s.size:
        return float(s.reshape(-1)[k]) == 1.0
    return bool(sizes and z is not None and shape is not None and int(z.reshape(-1)[k]) == shape[axis])


@rule("Resize")
def resize(ctx, node, grads):
    x = node.input[0]
    roi, scales, sizes = _operand(node, 1), _operand(node, 2), _operand(node, 3)
    if scales and sizes:
        s, z = ctx.value(scales), ctx.value(sizes)
        if s is not None and s.size == 0:
            scales = ""
        elif z is not None and z.size == 0:
            sizes = ""
        else:  # onnx's checker refuses such a node too
            raise ctx.error("with both scales and sizes inputs, which one is empty must be known while lowering")
    nearest = attr(node, "mode", "nearest") == "nearest"
    if sizes and attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        if nearest and not scales:
            return [_nearest(ctx, node, grads[0])] + [None] * (len(node.input) - 1)
        raise ctx.error("keep_aspect_ratio_policy other than stretch couples the axes; it is not lowered")
    rank = ctx.need_rank(x)
    axes = [a % rank for a in attr(node, "axes", list(range(rank)))]
    g = grads[0]
    for k, a in enumerate(axes):
        if _is_identity(ctx, node, k, scales, sizes, x, a):
            continue
        n = ctx.dims(x, a, a + 1)
        spread = _spread(ctx, node, k, len(axes), n, roi, scales, sizes, nearest)
        last = [i for i in range(rank) if i != a] + [a]
        moved = ctx.op("Transpose", [g], perm=last) if a != rank - 1 else g
        moved = ctx.op("MatMul", [moved, ctx.op("Transpose", [spread], perm=[1, 0])])
        g = ctx.op("Transpose", [moved], perm=[int(i) for i in np.argsort(last)]) if a != rank - 1 else moved
    return [g] + [None] * (len(node.input) - 1)


def _spread(ctx, node, k: int, n_axes: int, n: str, roi: str, scales: str, sizes: str, nearest: bool) -> str:
    """Axis k's interpolation matrix, [n, out]: row j is where input j goes. Built by the same Resize at run
    time (sizes never need to be static): linear modes resize the rows of an identity; nearest mode resizes one
    row of positions 1..n, whose result says which input each output copies (0: an extrapolated constant)."""
    x = node.input[0]
    crop = attr(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" and roi
    kept = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in BASIS_ATTRS}
    if nearest:  # int32 positions: one axis's length is below 2^31, and onnxruntime resizes int32
        count = ctx.op("Squeeze", [n, ctx.ints([0])])
        one = ctx.const(np.asarray(1, np.int64))
        positions = ctx.op("Range", [one, ctx.op("Add", [count, one]), one])
        basis = ctx.op("Cast", [ctx.op("Unsqueeze", [positions, ctx.ints([0])])], to=TensorProto.INT32)
        rows = ctx.ints([1])
    else:
        basis = ctx.op("EyeLike", [ctx.op("ConstantOfShape", [ctx.op("Concat", [n, n], axis=0)],
                                          value=ctx.tensor_like(1.0, x))])
        rows = n
    inputs = [basis, _axis_roi(ctx, roi, k, n_axes) if crop else ""]
    if scales:
        inputs.append(ctx.op("Concat", [ctx.const(np.ones(1, np.float32)), _slice(ctx, scales, k)], axis=0))
    else:
        inputs += ["", ctx.op("Concat", [rows, _slice(ctx, sizes, k)], axis=0)]
    spread = ctx.op("Resize", inputs, extrapolation_value=0.0, **kept)
    if not nearest:
        return spread
    column = ctx.op("Unsqueeze", [ctx.op("Squeeze", [basis, ctx.ints([0])]), ctx.ints([1])])
    return ctx.op("Cast", [ctx.op("Equal", [column, spread])], to=ctx.elem(x))


def _slice(ctx, t: str, k: int) -> str:
    return ctx.op("Slice", [t, ctx.ints([k]), ctx.ints([k + 1])])


def _nearest(ctx, node, g) -> str:
    """Nearest mode with sizes under keep_aspect_ratio_policy, whose scale couples the axes: the same Resize
    applied to (1 + each element's flat position) says where each output came from (0: an extrapolated
    constant), and g is added back there."""
    x = node.input[0]
    info = ctx.types.get(x)
    if info is None or info.shape is None or None in info.shape or np.prod(info.shape, dtype=np.int64) >= 2**31 - 1:
        raise ctx.error(f"nearest mode with keep_aspect_ratio_policy needs {x!r} to have a static size below 2^31 elements")
    positions = ctx.op("Add", [ctx.positions(x), ctx.const(np.asarray(1, np.int64))])
    # int32 holds every position of a tensor below 2^31 elements, and onnxruntime resizes it
    moved = ctx.op("Resize", [ctx.op("Cast", [positions], to=TensorProto.INT32)] + list(node.input[1:]),
                   **{a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "extrapolation_value"},
                   extrapolation_value=0.0)
    source = ctx.op("Reshape", [ctx.op("Cast", [moved], to=TensorProto.INT64), ctx.ints([-1])])
    size = ctx.op("Add", [ctx.op("Reshape", [ctx.op("Size", [x]), ctx.ints([1])]), ctx.ints([1])])
    added = ctx.scatter_add("ScatterElements", size, source, ctx.op("Reshape", [g, ctx.ints([-1])]), x, axis=0)
    kept = ctx.op("Slice", [added, ctx.ints([1]), ctx.ints([2**62])])
    return ctx.op("Reshape", [kept, ctx.op("Shape", [x])])


def _pick(ctx, t: str, k: int) -> str:
    return ctx.op("Gather", [t, ctx.ints([k])], axis=0)


def _axis_roi(ctx, roi: str, k: int, n: int) -> str:
    """[0, start_k, 1, end_k]: the 2-D basis keeps its first axis whole and crops the second as axis k."""
    elem = ctx.elem(roi) if ctx.elem(roi) in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16) \
        else TensorProto.FLOAT
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    zero, one = ctx.const(np.zeros(1, dtype)), ctx.const(np.ones(1, dtype))
    return ctx.op("Concat", [zero, _pick(ctx, roi, k), one, _pick(ctx, roi, n + k)], axis=0)
