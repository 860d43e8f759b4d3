"""Models built in memory: the Gradient spec's own first diagram is the explorer's default model.

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

from .loader import TRAINING_DOMAIN

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
