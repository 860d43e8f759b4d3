"""Small models for the feed, default and unknown-op tests, built in code."""
from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine

# The shipped example ops file: tests load what users are pointed at, not a copy of it.
MY_OPS = pathlib.Path(__file__).resolve().parent.parent / "sample_models" / "my_ops.py"


@pytest.fixture
def custom_op_path(tmp_path):
    """custom_op_model() saved as a file, for the CLI and the app."""
    p = tmp_path / "custom.onnx"
    onnx.save(custom_op_model(), p)
    return str(p)


@pytest.fixture
def ops_file():
    """sample_models/my_ops.py, with what it registers undone afterwards."""
    yield str(MY_OPS)
    if any(e.domain == "com.example" for e in engine.supported_ops()):
        engine.unregister_op("MyCustomOp", domain="com.example")


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def matmul_model(batch: int | str = 4):
    """Y = X @ W + 0 with X [batch, 8] float32 (batch may be symbolic) and W [8, 3]."""
    w = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    return _model(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 3])],
        {"W": w},
    )


TANH_W = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


def tanh_matmul_model(batch: int | str = 2):
    """loss = sum(tanh(X @ W)), X [batch, 3] float32 (batch may be symbolic), W = TANH_W."""
    return _model(
        [helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"), helper.make_node("Tanh", ["H"], ["T"], name="tanh"),
         helper.make_node("ReduceSum", ["T"], ["loss"], name="sum", keepdims=0)],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        {"W": TANH_W},
    )


def int_input_model():
    """loss = sum(Gather(E, idx) * X): idx is an int64 graph input, as a class target would be."""
    e = np.arange(15, dtype=np.float32).reshape(5, 3) / 10
    return _model(
        [helper.make_node("Gather", ["E", "idx"], ["rows"], name="gather"),
         helper.make_node("Mul", ["rows", "X"], ["prod"], name="mul"),
         helper.make_node("ReduceSum", ["prod"], ["loss"], name="sum", keepdims=0)],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        {"E": e},
    )


def custom_op_model():
    """engine.examples.custom_op: X -> Tanh -> A -> com.example::MyCustomOp -> B -> Add(A) -> Y,
    A -> Mul(W) -> Z avoiding the op, C = B * W below it."""
    from engine.examples import custom_op

    return custom_op()
