"""Models built in memory: the Gradient spec's own first diagram is the explorer's default model;
a custom op, a NaN that masked attention hides, and a language model's embedding front for the docs.

    X -----.
           v
    W --> Conv --> H --> Flatten --> Gemm --> Y      Gradient(xs=[W, Z], zs=[X], y=Y)
                                      ^               -> dY_dW, dY_dZ
                                      Z
ONNX Conv needs a 4-D input and Gemm a 2-D one, so a Flatten sits between H and Gemm; the spec
omits it along with every attribute.
"""
from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from .modelfile.index import TRAINING_DOMAIN

OPSET = 17


def spec_conv_gemm(with_gradient: bool = True) -> ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    z = rng.standard_normal((8, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["H"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Flatten", ["H"], ["H_flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["H_flat", "Z"], ["Y"], name="gemm"),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])]
    if with_gradient:
        nodes.append(helper.make_node("Gradient", ["W", "Z", "X"], ["dY_dW", "dY_dZ"], name="gradient",
                                      domain=TRAINING_DOMAIN, xs=["W", "Z"], zs=["X"], y="Y"))
        outputs += [helper.make_tensor_value_info("dY_dW", TensorProto.FLOAT, [2, 1, 3, 3]),
                    helper.make_tensor_value_info("dY_dZ", TensorProto.FLOAT, [8, 3])]
    graph = helper.make_graph(
        nodes, "spec_conv_gemm",
        inputs=[helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 4, 4]),
                helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 1, 3, 3]),
                helper.make_tensor_value_info("Z", TensorProto.FLOAT, [8, 3])],
        outputs=outputs,
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(z, "Z")],
    )
    opsets = [helper.make_opsetid("", OPSET)]
    if with_gradient:
        opsets.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="onnxgrad")
    model.ir_version = 8
    return model


def default_feeds() -> dict[str, np.ndarray]:
    return {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)}


def custom_op() -> ModelProto:
    """A model with an op onnxgrad does not know, `com.example::MyCustomOp` (node 'custom'):
    X -> Tanh -> A -> MyCustomOp -> B -> Add(A) -> Y; a branch A -> Mul(W) -> Z that avoids it;
    C = B * W below it. `sample_models/my_ops.py` registers the op (`--ops`)."""
    w = np.full((2, 3), 0.5, np.float32)
    floats = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("X", "Y", "Z", "C", "B")]
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["X"], ["A"], name="tanh"),
         helper.make_node("MyCustomOp", ["A"], ["B"], name="custom", domain="com.example"),
         helper.make_node("Add", ["B", "A"], ["Y"], name="add"),
         helper.make_node("Mul", ["A", "W"], ["Z"], name="mul"),
         helper.make_node("Mul", ["B", "W"], ["C"], name="below")],
        "custom_op", floats[:1], floats[1:4], [numpy_helper.from_array(w, "W")], value_info=floats[4:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def _init(name: str, value) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def hidden_nan_attention() -> ModelProto:
    """Masked attention as the exporters write it: Where(mask, 0, -inf) added to the scores, a
    Softmax (NaN on a row whose keys are all masked) and Where(IsNaN(p), 0, p) hiding the NaN from
    the forward. A constant-exponent Pow on negative values sits on each side of it: the gradient
    it sends to its exponent is NaN, but flows nowhere."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Pow", ["X", "three"], ["cubed"], name="cube_x"),
        helper.make_node("MatMul", ["cubed", "Wq"], ["q"], name="project"),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("MatMul", ["q", "qt"], ["scores"], name="scores"),
        helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL, name="to_bool"),
        helper.make_node("Unsqueeze", ["keep", "axis1"], ["keep3"], name="per_query"),
        helper.make_node("Where", ["keep3", "zero", "minus_inf"], ["bias"], name="mask_bias"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="add_bias"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("IsNaN", ["probs"], ["is_nan"], name="is_nan"),
        helper.make_node("Where", ["is_nan", "zero", "probs"], ["probs_finite"], name="hide_nan"),
        helper.make_node("MatMul", ["X", "Wv"], ["v"], name="values"),
        helper.make_node("MatMul", ["probs_finite", "v"], ["attended"], name="attend"),
        helper.make_node("Pow", ["attended", "three"], ["attended3"], name="cube_out"),
        helper.make_node("ReduceSum", ["attended3"], ["Y"], keepdims=0, name="total"),
    ]
    graph = helper.make_graph(
        nodes, "hidden_nan_attention",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
        [_init("Wq", rng.standard_normal((4, 4)).astype(np.float32)),
         _init("Wv", rng.standard_normal((4, 4)).astype(np.float32)),
         _init("three", np.float32(3.0)), _init("zero", np.float32(0.0)),
         _init("minus_inf", np.float32(-np.inf)), _init("axis1", np.array([1], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


VOCAB, WIDTH, POSITIONS = 7, 4, 32


def embedding_tables():
    rng = np.random.default_rng(1)
    return (rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
            rng.standard_normal((POSITIONS, WIDTH)).astype(np.float32),
            rng.standard_normal((WIDTH, 3)).astype(np.float32))


def token_embeddings() -> ModelProto:
    """A language model's front as exporters write it: x = E[ids], and position ids from
    Shape(ids), so ids reach y around x through integers only.

        y = (tanh(E[ids] + P[arange(seq)]) * mask[..., None]) @ W      ids, mask: int64 [batch, seq]
    """
    e, p, w = embedding_tables()
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["x"], name="embed"),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="shape"),
        helper.make_node("Gather", ["ids_shape", "one"], ["seq_len"], axis=0, name="seq_len"),
        helper.make_node("Range", ["zero_i", "seq_len", "one"], ["positions"], name="positions"),
        helper.make_node("Gather", ["P", "positions"], ["pe"], name="embed_positions"),
        helper.make_node("Add", ["x", "pe"], ["h"], name="add_positions"),
        helper.make_node("Tanh", ["h"], ["a"], name="tanh"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="mask_float"),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"], name="mask_axis"),
        helper.make_node("Mul", ["a", "mask3"], ["kept"], name="apply_mask"),
        helper.make_node("MatMul", ["kept", "W"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "token_embeddings",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 3])],
        [_init("E", e), _init("P", p), _init("W", w), _init("one", np.int64(1)), _init("zero_i", np.int64(0)),
         _init("last", np.array([-1], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
