"""Forward rules of the normalizing ops: Softmax, LogSoftmax and LayerNormalization."""
from __future__ import annotations

from onnx import TensorProto

from ..context import attr
from .registry import jvp_rule


@jvp_rule("Softmax")
def softmax(ctx, node, ins):
    """y·(tx - Σ y·tx) along the axis."""
    y, axis = node.output[0], attr(node, "axis", -1)
    spread = ctx.reduce_sum(ctx.op("Mul", [y, ins[0]]), [axis])
    return [ctx.op("Mul", [y, ctx.op("Sub", [ins[0], spread])])]


@jvp_rule("LogSoftmax")
def log_softmax(ctx, node, ins):
    """tx - Σ softmax·tx along the axis."""
    y, axis = node.output[0], attr(node, "axis", -1)
    return [ctx.op("Sub", [ins[0], ctx.reduce_sum(ctx.op("Mul", [ctx.op("Exp", [y]), ins[0]]), [axis])])]


@jvp_rule("LayerNormalization")
def layer_norm(ctx, node, ins):
    """With x̂ = (x - μ)·r and c = tx - mean(tx): tx̂ = r·(c - x̂·mean(x̂·c)), ty = tx̂·scale + x̂·tscale + tB.
    x̂ and r come from one more LayerNormalization of x with scale 1 and no bias."""
    x = node.input[0]
    if ins[0] is None or ctx.elem(x) != TensorProto.FLOAT or len([o for o in node.output if o]) > 1:
        return NotImplemented  # r is stashed in float32 (not x's half or double), or Mean / InvStdDev are read
    rank = ctx.need_rank(x)
    axis = attr(node, "axis", -1) % rank
    axes = list(range(axis, rank))
    hint = f"{node.name or node.op_type}/{node.op_type}"
    xhat, rstd = ctx.fresh(hint), ctx.fresh(hint)
    ctx.emit("LayerNormalization", [x, ctx.fill_like(node.input[1], 1.0)], [xhat, "", rstd],
             **{a.name: _value(a) for a in node.attribute})
    centred = ctx.op("Sub", [ins[0], ctx.reduce("ReduceMean", ins[0], axes)])
    spread = ctx.reduce("ReduceMean", ctx.op("Mul", [xhat, centred]), axes)
    t_xhat = ctx.op("Mul", [rstd, ctx.op("Sub", [centred, ctx.op("Mul", [xhat, spread])])])
    terms = [ctx.op("Mul", [t_xhat, node.input[1]])]
    if len(ins) > 1 and ins[1] is not None:
        terms.append(ctx.op("Mul", [xhat, ins[1]]))
    if len(ins) > 2 and ins[2] is not None:
        terms.append(ins[2])
    return [ctx.add_all(terms)] + [None] * (len(node.output) - 1)


def _value(a):
    from onnx import helper

    return helper.get_attribute_value(a)
