"""The Gradient spec's diagrams as ONNX models, built with onnx.helper (shared by several tests)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from engine.modelfile.index import TRAINING_DOMAIN

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), training=True, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)]
    if training:
        opsets.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 8
    return m


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def grad_wrt_h():
    """Diagram 2/4: Gradient(xs=[H, Z], y=Y) fed with H_1 and Z_1."""
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["H"], kernel_shape=[3, 3]),
        helper.make_node("Flatten", ["H"], ["H_flat"]),
        helper.make_node("Gemm", ["H_flat", "Z"], ["Y"]),
        helper.make_node("Gradient", ["H_1", "Z_1"], ["dY_dH", "dY_dZ"], domain=TRAINING_DOMAIN,
                         xs=["H", "Z"], y="Y"),
    ]
    return _model(
        nodes,
        [vi("X", [1, 1, 4, 4]), vi("W", [2, 1, 3, 3]), vi("Z", [8, 3]), vi("H_1", [1, 2, 2, 2]), vi("Z_1", [8, 3])],
        [vi("Y", [1, 3]), vi("dY_dH", [1, 2, 2, 2]), vi("dY_dZ", [8, 3])],
    )


def second_order():
    """Diagram 3: O = sum((X @ W - L)^2); Gradient of O, then Gradient of dO/dW (d²O/dW²)."""
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Y"]),
        helper.make_node("Sub", ["Y", "L"], ["E"]),
        helper.make_node("Mul", ["E", "E"], ["E2"]),
        helper.make_node("ReduceSum", ["E2"], ["O"], keepdims=0),
        helper.make_node("Gradient", ["X", "W", "L"], ["dO_dX", "dO_dW"], domain=TRAINING_DOMAIN,
                         xs=["X", "W"], zs=["L"], y="O"),
        helper.make_node("Gradient", ["X", "W", "L"], ["d2O_dWdX", "d2O_dW2"], domain=TRAINING_DOMAIN,
                         xs=["X", "W"], zs=["L"], y="dO_dW"),
    ]
    return _model(
        nodes,
        [vi("X", [2, 3]), vi("W", [3, 2]), vi("L", [2, 2])],
        [vi("O", []), vi("dO_dX", [2, 3]), vi("dO_dW", [3, 2]), vi("d2O_dWdX", [2, 3]), vi("d2O_dW2", [3, 2])],
    )


def fan_out():
    """A tensor read by three consumers, and an input y does not depend on (D)."""
    nodes = [
        helper.make_node("Mul", ["A", "B"], ["P"]),
        helper.make_node("Tanh", ["P"], ["T"]),
        helper.make_node("Sigmoid", ["P"], ["S"]),
        helper.make_node("Add", ["T", "S"], ["U"]),
        helper.make_node("Mul", ["U", "P"], ["Y"]),
        helper.make_node("Neg", ["D"], ["ND"]),
    ]
    return _model(nodes, [vi("A", [3, 4]), vi("B", [4]), vi("D", [2])], [vi("Y", [3, 4]), vi("ND", [2])],
                  training=False)


def with_initializer(value):
    """Y = X * K with K an initializer that is also a graph input (an overridable default)."""
    k = numpy_helper.from_array(np.asarray(value, np.float32), "K")
    nodes = [helper.make_node("Mul", ["X", "K"], ["Y"]), helper.make_node("Cast", ["X"], ["Xi"], to=TensorProto.INT64)]
    return _model(nodes, [vi("X", [3]), vi("K", [3])], [vi("Y", [3]), vi("Xi", [3], TensorProto.INT64)], [k],
                  training=False)
