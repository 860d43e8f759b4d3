"""Models with symbolic axes (batch, image size, sequence length) lowered once and run by onnxruntime at
several sizes, against the engine: the rules read shapes with Shape ops where the model's shape is not
static. Each model is written at the opset whose ops it uses (17 to 23), and every lowered model must
pass onnx's full checker and strict shape inference at that opset."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from tests.lowering_checks import assert_close, check_valid, ort_run

pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT


def _model(nodes, inputs, output, inits, opset):
    (name, shape) = output
    graph = helper.make_graph(nodes, "symbolic", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(name, F, shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(rng, shapes):
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _check(model, y, xs, feeds_list, zs=()):
    lowered = engine.lower(model, y, xs, list(zs), dy=True)
    check_valid(lowered)
    m = engine.load(model)
    for k, feeds in enumerate(feeds_list):  # one lowered model, every input size
        dy = np.random.default_rng(k).standard_normal(m.run(feeds)[y].shape).astype(np.float32)
        want = m.gradient(y, xs, list(zs), feeds=feeds, dy=dy).grads
        assert_close(ort_run(lowered, {**feeds, f"d{y}": dy}), {f"d{y}_d{x}": g for x, g in want.items()})
    return lowered


def test_cnn_with_symbolic_batch_and_image_size():
    """Conv (strided, grouped), ConvTranspose, MaxPool, AveragePool with pads, LpPool, a Slice whose end is
    read from Shape, Resize, GlobalAveragePool; batch, height and width all symbolic."""
    rng = np.random.default_rng(0)
    w = _weights(rng, {"W1": (4, 2, 3, 3), "B1": (4,), "WT": (4, 2, 2, 2), "W2": (3, 4, 3, 3)})
    n = helper.make_node
    nodes = [
        n("Conv", ["X", "W1", "B1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1], group=1),
        n("HardSwish", ["c1"], ["a1"]),
        n("ConvTranspose", ["a1", "WT"], ["t1"], strides=[2, 2], group=2),
        n("MaxPool", ["t1"], ["p1"], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
        n("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0),
        n("Shape", ["p2"], ["sp"]),
        n("Gather", ["sp", "two"], ["h"], axis=0),
        n("Div", ["h", "two_i"], ["half"]),
        n("Unsqueeze", ["half", "zero"], ["end"]),
        n("Slice", ["p2", "zero", "end", "two1"], ["s1"]),  # the top half of the rows, at any height
        n("Conv", ["s1", "W2"], ["c2"], pads=[1, 1, 1, 1], dilations=[1, 1]),
        n("LpPool", ["c2"], ["l1"], kernel_shape=[2, 2], p=2),
        n("Resize", ["l1", "", "scales"], ["r1"], mode="linear"),
        n("Gelu", ["r1"], ["g1"]),
        n("GlobalAveragePool", ["g1"], ["Y"]),
    ]
    consts = {"two": np.array(2, np.int64), "two_i": np.array(2, np.int64), "zero": np.array([0], np.int64),
              "two1": np.array([2], np.int64), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = _model(nodes, [("X", ["batch", 2, "height", "width"])] + [(k, v.shape) for k, v in w.items()],
                   ("Y", ["batch", 3, 1, 1]), consts, 20)
    xs = ["X", *w]
    feeds = [{**w, "X": rng.standard_normal(s).astype(np.float32)} for s in [(2, 2, 8, 8), (1, 2, 12, 10)]]
    lowered = _check(model, "Y", xs, feeds)
    dx = next(i for i in lowered.graph.output if i.name == "dY_dX")
    assert [d.dim_param or d.dim_value for d in dx.type.tensor_type.shape.dim][0] == "batch"


@pytest.mark.parametrize("op", ["GRU"])  # LSTM and RNN unroll the same way (and the node-case sweep has all three)
def test_recurrent_with_symbolic_batch(op):
    """Unrolled over the static time axis; the batch is symbolic; bidirectional with sequence_lens."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    hidden, inputs, steps = 3, 2, 4
    rng = np.random.default_rng(1)
    w = _weights(rng, {"W": (2, gates * hidden, inputs), "R": (2, gates * hidden, hidden), "B": (2, 2 * gates * hidden)})
    nodes = [helper.make_node("Cast", ["L"], ["lens"], to=TensorProto.INT32),
             helper.make_node(op, ["X", "W", "R", "B", "lens"], ["Yseq", "Yh"], hidden_size=hidden,
                              direction="bidirectional"),
             helper.make_node("ReduceSum", ["Yseq"], ["s"], keepdims=0),
             helper.make_node("Mul", ["Yh", "s"], ["Y"])]
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info("X", F, [steps, "batch", inputs]),
                                             helper.make_tensor_value_info("L", TensorProto.INT64, ["batch"])]
                              + [helper.make_tensor_value_info(k, F, v.shape) for k, v in w.items()],
                              [helper.make_tensor_value_info("Y", F, [2, "batch", hidden])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    feeds = [{**w, "X": rng.standard_normal((steps, b, inputs)).astype(np.float32),
              "L": np.array(lens, np.int64)} for b, lens in [(2, [4, 2]), (3, [1, 4, 3])]]
    _check(model, "Y", ["X", *w], feeds, zs=["L"])


@pytest.mark.parametrize("opset", [17, 20, 23])
def test_transformer_ops_with_symbolic_batch_and_sequence(opset):
    """LayerNormalization (all three outputs), Softmax, Gelu (from 20), RMSNormalization (from 23) on
    [batch, seq, 6]: the statistics' ReduceMean takes its axes the way each opset wants."""
    rng = np.random.default_rng(opset)
    w = _weights(rng, {"scale": (6,), "bias": (6,), "W": (6, 6)})
    n = helper.make_node
    nodes = [n("LayerNormalization", ["X", "scale", "bias"], ["ln", "mean", "inv"], axis=-1),
             n("MatMul", ["ln", "W"], ["h"]),
             n("Gelu", ["h"], ["a"], approximate="tanh") if opset >= 20 else n("Tanh", ["h"], ["a"]),
             n("RMSNormalization", ["a", "scale"], ["r"]) if opset >= 23 else n("Identity", ["a"], ["r"]),
             n("Softmax", ["r"], ["p"], axis=1),
             n("Mul", ["p", "inv"], ["pm"]), n("Add", ["pm", "mean"], ["Y"])]
    model = _model(nodes, [("X", ["batch", "seq", 6])] + [(k, v.shape) for k, v in w.items()],
                   ("Y", ["batch", "seq", 6]), {}, opset)
    feeds = [{**w, "X": rng.standard_normal(s).astype(np.float32)} for s in [(2, 5, 6), (1, 3, 6)]]
    lowered = _check(model, "Y", ["X", *w], feeds)
    assert lowered.opset_import[0].version == opset  # no downgrade, no upgrade
