"""A transformer block as exporters write it (LayerNorm decomposed into ReduceMean, Sub, Pow, Sqrt,
Div; attention with Transpose and a Div by sqrt(d); GELU with Erf) and a symbolic batch axis, so the
shape-agnostic broadcasting rules run: lowered, run by onnxruntime, compared with the engine."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from tests.lowering_checks import assert_close, check_valid, ort_run

pytest.importorskip("onnxruntime")
SEQ, DIM = 4, 6
WEIGHTS = {"Wq": (DIM, DIM), "Wk": (DIM, DIM), "Wv": (DIM, DIM), "W1": (DIM, 2 * DIM), "W2": (2 * DIM, DIM),
           "gamma": (DIM,), "beta": (DIM,)}


def block(opset: int):
    consts = {"two": np.float32(2.0), "eps": np.float32(1e-5), "scale": np.float32(np.sqrt(DIM)),
              "half": np.float32(0.5), "one": np.float32(1.0), "rsqrt2": np.float32(1 / np.sqrt(2))}
    n = helper.make_node

    def mean(x, out):  # ReduceMean takes its axes as an attribute before opset 18, as an input from 18
        if opset >= 18:
            return n("ReduceMean", [x, "axes"], [out], keepdims=1)
        return n("ReduceMean", [x], [out], axes=[-1], keepdims=1)

    nodes = [
        mean("X", "mu"), n("Sub", ["X", "mu"], ["xc"]), n("Pow", ["xc", "two"], ["sq"]), mean("sq", "var"),
        n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["xc", "sd"], ["xn"]),
        n("Mul", ["xn", "gamma"], ["xg"]), n("Add", ["xg", "beta"], ["h"]),
        n("MatMul", ["h", "Wq"], ["q"]), n("MatMul", ["h", "Wk"], ["k"]), n("MatMul", ["h", "Wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["s0"]),
        n("Div", ["s0", "scale"], ["s"]), n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["att"]),
        n("Add", ["X", "att"], ["r1"]), n("MatMul", ["r1", "W1"], ["f1"]),
        n("Mul", ["f1", "rsqrt2"], ["f2"]), n("Erf", ["f2"], ["f3"]), n("Add", ["f3", "one"], ["f4"]),
        n("Mul", ["f1", "f4"], ["f5"]), n("Mul", ["f5", "half"], ["gelu"]), n("MatMul", ["gelu", "W2"], ["f6"]),
        n("Add", ["r1", "f6"], ["Y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", SEQ, DIM])]
    inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in WEIGHTS.items()]
    graph = helper.make_graph(nodes, "block", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", SEQ, DIM])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, 18])
def test_decomposed_transformer_block_with_symbolic_batch(opset):
    model = block(opset)
    xs = ["X", *WEIGHTS]
    lowered = engine.lower(model, "Y", xs, dy=True)
    check_valid(lowered)
    rng = np.random.default_rng(opset)
    feeds = {k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for k, s in WEIGHTS.items()}
    for batch in (1, 3):  # one lowered model serves every batch size
        feeds["X"] = rng.standard_normal((batch, SEQ, DIM)).astype(np.float32)
        dy = rng.standard_normal((batch, SEQ, DIM)).astype(np.float32)
        got = ort_run(lowered, {**feeds, "dY": dy})
        want = engine.load(model).gradient("Y", xs, feeds=feeds, dy=dy).grads
        assert_close(got, {f"dY_d{x}": g for x, g in want.items()})
