"""Backward rule of Attention (opset 23 and up): its ONNX function body, with a softmax that stays finite
on a fully masked row.

The body computes Softmax over the masked scores, which is NaN on a row whose every key is masked
(all -inf), then hides it with Where(row all masked, 0, softmax). Reverse mode through that Where
multiplies the NaN by the zero gradient Where sends back, and NaN · 0 is NaN (the double-where
problem). The rule runs the Softmax on the scores with such rows replaced by zeros: every row the
body keeps is computed as before, the rows it zeroes are finite, so their gradient is exactly 0, as
the engine's Attention kernel gives.
"""
from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper, numpy_helper

from .context import attr
from .decompose import function_body, inline, through
from .registry import rule


def _constant(name: str, value) -> NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def finite_softmax(ctx, nodes: list[NodeProto]) -> list[NodeProto]:
    """The body's nodes with each Softmax reading its input with the rows that are all -inf set to 0
    (the row maximum is -inf exactly there); the ops are ReduceMax, Equal and Where, at opset 18 and up."""
    used = {t for n in nodes for t in list(n.input) + list(n.output)}
    out, edited = [], 0
    for n in nodes:
        if n.op_type != "Softmax" or n.domain not in ("", "ai.onnx"):
            out.append(n)
            continue
        edited += 1
        x, stem = n.input[0], f"FiniteSoftmax{edited}"
        while any(t.startswith(stem) for t in used):
            stem += "_"
        names = {k: f"{stem}/{k}" for k in ("Axes", "NegInf", "NegInfT", "Zero", "ZeroT", "RowMax", "RowEmpty", "Scores")}
        out += [
            _constant(names["Axes"], np.asarray([attr(n, "axis", -1)], np.int64)),
            _constant(names["NegInf"], np.asarray(-np.inf, np.float32)),
            helper.make_node("CastLike", [names["NegInf"], x], [names["NegInfT"]]),
            _constant(names["Zero"], np.asarray(0.0, np.float32)),
            helper.make_node("CastLike", [names["Zero"], x], [names["ZeroT"]]),
            helper.make_node("ReduceMax", [x, names["Axes"]], [names["RowMax"]], keepdims=1),
            helper.make_node("Equal", [names["RowMax"], names["NegInfT"]], [names["RowEmpty"]]),
            helper.make_node("Where", [names["RowEmpty"], names["ZeroT"], x], [names["Scores"]]),
        ]
        softmax = NodeProto()
        softmax.CopyFrom(n)
        softmax.input[0] = names["Scores"]
        out.append(softmax)
    if not edited:
        raise ctx.error("its function body has no Softmax to keep finite on fully masked rows")
    return out


@rule("Attention")
def attention(ctx, node, grads):
    body = function_body(ctx, node)
    if body is None:
        raise ctx.error("onnx builds no function body for these attributes and input types")
    return through(ctx, node, grads, lambda: inline(ctx, node, body, lambda nodes: finite_softmax(ctx, nodes)))
