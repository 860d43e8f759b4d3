"""Random small graphs built from the ops that have backward rules (a repeated Gather index included), at
a random opset from 17 to 23: lowered, run by onnxruntime, compared with the engine's gradients w.r.t.
every input (a random dy seeds a (2, 3) y)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from tests.lowering_checks import assert_close, check_valid, ort_run

pytest.importorskip("onnxruntime")
ROWS, COLS = 2, 3
INPUTS = {"a": (ROWS, COLS), "b": (ROWS, COLS), "bias": (COLS,), "W": (COLS, COLS), "scale": (COLS,)}


class Builder:
    """Nodes over a pool of (2, 3) tensors; every op keeps that shape so any two can be combined."""

    def __init__(self, opset: int):
        self.nodes, self.consts, self.k, self.opset = [], {}, 0, opset

    def op(self, op_type, inputs, **attrs):
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self.k}", **attrs))
        return out

    def const(self, values, dtype=np.float32):
        name = f"c{len(self.consts)}"
        self.consts[name] = np.asarray(values, dtype=dtype)
        return name

    def reduce(self, op_type, x, axes, keepdims):  # axes: an attribute before opset 18, an input from 18
        if self.opset >= 18:
            return self.op(op_type, [x, self.const(axes, np.int64)], keepdims=keepdims)
        return self.op(op_type, [x], axes=axes, keepdims=keepdims)

    def bounded(self, x, low):  # sigmoid(x) + low: a positive, bounded operand for Log/Sqrt/Pow/Div
        return self.op("Add", [self.op("Sigmoid", [x]), self.const(low)])


UNARY = {
    "Tanh": lambda b, x: b.op("Tanh", [x]),
    "Relu": lambda b, x: b.op("Relu", [x]),
    "Abs": lambda b, x: b.op("Abs", [x]),
    "Neg": lambda b, x: b.op("Neg", [x]),
    "Erf": lambda b, x: b.op("Erf", [x]),
    "Exp": lambda b, x: b.op("Exp", [b.op("Tanh", [x])]),
    "Log": lambda b, x: b.op("Log", [b.bounded(x, 0.2)]),
    "Sqrt": lambda b, x: b.op("Sqrt", [b.bounded(x, 0.2)]),
    "Reciprocal": lambda b, x: b.op("Reciprocal", [b.bounded(x, 0.5)]),
    "Pow": lambda b, x: b.op("Pow", [b.bounded(x, 0.5), b.const(1.5)]),
    "Softmax": lambda b, x: b.op("Softmax", [x], axis=-1),
    "LogSoftmax": lambda b, x: b.op("LogSoftmax", [x], axis=0),
    "LayerNormalization": lambda b, x: b.op("LayerNormalization", [x, "scale", "bias"], axis=-1),
    "MatMul": lambda b, x: b.op("MatMul", [x, "W"]),
    "Gemm": lambda b, x: b.op("Gemm", [x, "W", "bias"], transB=1, alpha=0.5),
    "Transpose": lambda b, x: b.op("Reshape", [b.op("Transpose", [x], perm=[1, 0]), b.const([ROWS, COLS], np.int64)]),
    "ReduceMean": lambda b, x: b.op("Sub", [x, b.reduce("ReduceMean", x, [1], 1)]),
    "ReduceSum": lambda b, x: b.op("Mul", [x, b.op("ReduceSum", [x, b.const([0], np.int64)], keepdims=1)]),
    "Softplus": lambda b, x: b.op("Softplus", [x]),
    "Clip": lambda b, x: b.op("Clip", [x, b.const(-0.5), b.const(0.7)]),
    "ReduceMax": lambda b, x: b.op("Sub", [x, b.reduce("ReduceMax", x, [1], 1)]),
    "ReduceMin": lambda b, x: b.op("Mul", [x, b.reduce("ReduceMin", x, [0], 0)]),
    "ReduceProd": lambda b, x: b.op("Add", [x, b.reduce("ReduceProd", b.op("Tanh", [x]), [1], 1)]),
    "ReduceL1": lambda b, x: b.op("Mul", [x, b.reduce("ReduceL1", x, [0], 0)]),
    "HardSwish": lambda b, x: b.op("HardSwish", [b.op("Mul", [x, b.const(4.0)])]),
    "HardSigmoid": lambda b, x: b.op("HardSigmoid", [x], alpha=0.4),
    "Elu": lambda b, x: b.op("Elu", [x], alpha=0.7),
    "Selu": lambda b, x: b.op("Selu", [x]),
    "Celu": lambda b, x: b.op("Celu", [x], alpha=1.5),
    "Mish": lambda b, x: b.op("Mish", [x]),
    "Softsign": lambda b, x: b.op("Softsign", [x]),
    "PRelu": lambda b, x: b.op("PRelu", [x, "scale"]),
    "ThresholdedRelu": lambda b, x: b.op("ThresholdedRelu", [x], alpha=0.3),
    "Atan": lambda b, x: b.op("Atan", [x]),
    "Sinh": lambda b, x: b.op("Sinh", [x]),
    "Asin": lambda b, x: b.op("Asin", [b.op("Mul", [b.op("Tanh", [x]), b.const(0.9)])]),
    "CumSum": lambda b, x: b.op("CumSum", [x, b.const(1, np.int64)], reverse=1),
    "CumProd": lambda b, x: b.op("CumProd", [x, b.const(0, np.int64)], exclusive=1),
    "Tile": lambda b, x: b.op("Slice", [b.op("Tile", [x, b.const([2, 2], np.int64)]), b.const([1, 2], np.int64),
                                        b.const([1 + ROWS, 2 + COLS], np.int64)]),
    "PadReflect": lambda b, x: b.op("Slice", [b.op("Pad", [x, b.const([1, 2, 1, 0], np.int64)], mode="reflect"),
                                              b.const([0, 0], np.int64), b.const([ROWS, COLS], np.int64)]),
    "GatherElements": lambda b, x: b.op("GatherElements", [x, b.const([[2, 0, 2], [1, 1, 0]], np.int64)], axis=1),
    "LpNormalization": lambda b, x: b.op("LpNormalization", [x], axis=1, p=2),
    "Einsum": lambda b, x: b.op("Einsum", [x, "W"], equation="ij,kj->ik"),
    "Gather": lambda b, x: b.op("Gather", [x, b.const([2, -3, -1], np.int64)], axis=1),
    "Flatten": lambda b, x: b.op("Reshape", [b.op("Flatten", [x], axis=0), b.const([ROWS, COLS], np.int64)]),
    "Conv": lambda b, x: b.op("Reshape", [
        b.op("Conv", [b.op("Reshape", [x, b.const([1, 1, ROWS, COLS], np.int64)]),
                      b.const(np.full((1, 1, 2, 2), 0.5))], pads=[0, 0, 1, 1]), b.const([ROWS, COLS], np.int64)]),
    "MaxPool": lambda b, x: b.op("Reshape", [
        b.op("MaxPool", [b.op("Reshape", [x, b.const([1, 1, ROWS, COLS], np.int64)])], kernel_shape=[2, 2],
             pads=[0, 0, 1, 1]), b.const([ROWS, COLS], np.int64)]),
    "AveragePool": lambda b, x: b.op("Reshape", [
        b.op("AveragePool", [b.op("Reshape", [x, b.const([1, 1, ROWS, COLS], np.int64)])], kernel_shape=[2, 2],
             pads=[1, 1, 0, 0]), b.const([ROWS, COLS], np.int64)]),
}
BINARY = {
    "Add": lambda b, x, y: b.op("Add", [x, y]),
    "Sub": lambda b, x, y: b.op("Sub", [x, y]),
    "Mul": lambda b, x, y: b.op("Mul", [x, y]),
    "Div": lambda b, x, y: b.op("Div", [x, b.bounded(y, 0.5)]),
    "Max": lambda b, x, y: b.op("Max", [x, y]),
    "Min": lambda b, x, y: b.op("Min", [x, y]),
    "Sum": lambda b, x, y: b.op("Sum", [x, y, "bias"]),
    "Where": lambda b, x, y: b.op("Where", [b.op("Greater", [x, y]), x, b.op("Tanh", [y])]),
    "Concat": lambda b, x, y: b.op("Slice", [b.op("Concat", [x, y], axis=1), b.const([1], np.int64),
                                             b.const([1 + COLS], np.int64), b.const([1], np.int64)]),
    "BroadcastBias": lambda b, x, y: b.op("Mul", [b.op("Add", [x, "bias"]), y]),
}


NEWER = {"Gelu": 20, "Mish": 18, "CumProd": 26}  # ops that exist from a later opset than 17
UNARY["Gelu"] = lambda b, x: b.op("Gelu", [x], approximate="tanh")


@st.composite
def graphs(draw):
    b = Builder(draw(st.sampled_from([17, 20, 23])))
    pool = ["a", "b"]
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            fn = UNARY[draw(st.sampled_from(sorted(op for op in UNARY if NEWER.get(op, 0) <= b.opset)))]
            pool.append(fn(b, draw(st.sampled_from(pool))))
        else:
            fn = BINARY[draw(st.sampled_from(sorted(BINARY)))]
            pool.append(fn(b, draw(st.sampled_from(pool)), draw(st.sampled_from(pool))))
    y = b.op("Add", [pool[-1], b.op("Tanh", [draw(st.sampled_from(pool))])])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in INPUTS.items()]
    inits = [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape, v.reshape(-1).tolist())
             for n, v in b.consts.items()]
    graph = helper.make_graph(b.nodes, "random", inputs, [helper.make_tensor_value_info(y, TensorProto.FLOAT,
                                                                                          [ROWS, COLS])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)]), y, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_lower_to_the_engines_gradients(case):
    model, y, seed = case
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in INPUTS.items()}
    dy = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    xs = list(INPUTS)
    lowered = engine.lower(model, y, xs, dy=True, names=[f"g_{x}" for x in xs])
    check_valid(lowered)
    got = ort_run(lowered, {**feeds, f"d{y}": dy})
    want = engine.load(model).gradient(y, xs, feeds=feeds, dy=dy).grads
    assert_close(got, {f"g_{x}": g for x, g in want.items()})
