"""vit-like blocks built in code, spelling GELU and attention the ways the torch exporters do
(and ways they might), for the fusion tests."""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper, shape_inference

# GELU spellings of 0.5 * h * (1 + erf(h / sqrt 2)): TorchScript's, dynamo's, and a reordered one.
GELUS = ("torchscript", "dynamo", "half_first")
# Attention scalings: both operands scaled (both exporters), the scores divided or multiplied, none.
ATTENTIONS = ("pre", "post_div", "post_mul", "none")


def vit_block(*, b=2, s=5, heads=2, dh=4, hidden=8, gelu="torchscript", attention="pre", seed=0,
              constants="init", leak=None, expose=None, mask=False, axis=-1, half=0.5, dynamic_scale=False,
              elem=TensorProto.FLOAT):
    """x [b, s, heads*dh] -> self-attention -> Linear(hidden) -> GELU -> Linear -> y [b, s, heads*dh].

    `leak`: a tensor also read by a node outside its pattern (y adds its sum); `expose`: a tensor
    also listed as a graph output; `mask`: scores + a constant mask before Softmax; `axis`: the
    Softmax axis; `half`: GELU's 0.5; `dynamic_scale`: the scale depends on x's values. `gelu` or
    `attention` "skip" leaves that part out (a plan with one pattern only)."""
    d = heads * dh
    rng = np.random.default_rng(seed)
    npt = np.float64 if elem == TensorProto.DOUBLE else np.float32
    nodes, inits = [], []

    def const(name, value, dtype=None):
        arr = np.asarray(value, dtype=dtype or npt)
        if constants == "node":
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        else:
            inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    for w, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("w1", (d, hidden)), ("w2", (hidden, d))):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / math.sqrt(shape[0])).astype(npt), w))
    split = const("split", [0, 0, heads, dh], np.int64)
    for name in "qkv":
        node("Reshape", [node("MatMul", ["x", "w" + name], name + "_lin"), split], name + "_4d")
    q = node("Transpose", ["q_4d"], "q", perm=[0, 2, 1, 3])
    kt = node("Transpose", ["k_4d"], "kt", perm=[0, 2, 3, 1])
    v = node("Transpose", ["v_4d"], "v", perm=[0, 2, 1, 3])
    if dynamic_scale:
        root = node("Sqrt", [node("ReduceL2", ["x"], "x_norm", keepdims=0)], "scale")
    else:
        root = const("scale", dh ** -0.25)
    if attention == "skip":
        scores = node("MatMul", [q, kt], "scores")  # no Softmax: nothing to fuse
    elif attention == "pre":
        scores = node("MatMul", [node("Mul", [q, root], "q_scaled"), node("Mul", [root, kt], "k_scaled")], "scores")
    else:
        raw = node("MatMul", [q, kt], "scores")
        if attention == "post_div":
            scores = node("Div", [raw, const("root_d", math.sqrt(dh))], "scores_scaled")
        elif attention == "post_mul":
            scores = node("Mul", [const("inv_root_d", 1 / math.sqrt(dh)), raw], "scores_scaled")
        else:
            scores = raw
    if mask:
        scores = node("Add", [scores, const("mask", np.triu(np.full((s, s), -1e4), 1))], "masked")
    p = scores if attention == "skip" else node("Softmax", [scores], "p", axis=axis)
    o = node("MatMul", [p, v], "attn")
    o3 = node("Reshape", [node("Transpose", [o], "attn_t", perm=[0, 2, 1, 3]), const("merge", [0, 0, d], np.int64)],
              "attn_3d")
    h = node("MatMul", [o3, "w1"], "h")
    if gelu == "skip":
        g = node("Relu", [h], "g")
    elif gelu == "half_first":
        erf = node("Erf", [node("Mul", [h, const("inv_sqrt2", math.sqrt(0.5))], "h_scaled")], "erf")
        u = node("Add", [const("one", 1.0), erf], "u")
        g = node("Mul", [u, node("Mul", [h, const("half", half)], "h_half")], "g")
    else:
        erf = node("Erf", [node("Div", [h, const("sqrt2", math.sqrt(2))], "h_scaled")], "erf")
        u = node("Add", [erf, const("one", 1.0)], "u")
        if gelu == "torchscript":
            g = node("Mul", [node("Mul", [h, u], "hu"), const("half", half)], "g")
        else:
            g = node("Mul", [h, node("Mul", [const("half", half), u], "half_u")], "g")
    y = node("MatMul", [g, "w2"], "y0")
    if leak is not None:
        y = node("Add", [y, node("ReduceSum", [leak], "leak_sum", keepdims=0)], "y")
    else:
        y = node("Identity", [y], "y")
    graph = helper.make_graph(nodes, "vit_block", [helper.make_tensor_value_info("x", elem, [b, s, d])],
                              [helper.make_tensor_value_info("y", elem, [b, s, d])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if expose is not None:  # with the shape inference gives it (an output needs one)
        inferred = shape_inference.infer_shapes(model).graph.value_info
        model.graph.output.append(next(v for v in inferred if v.name == expose))
    return model


def vit_input(b=2, s=5, d=8, seed=1, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((b, s, d)).astype(dtype)
