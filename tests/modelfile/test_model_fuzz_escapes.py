"""Escapes found by the long load-path fuzz with no memory limit (issue 35, benchmarks/fuzz_models.py),
each as the smallest hand-built model that shows it: every one must fail in one line, an OnnxGradError."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import engine
from engine.errors import BadAttributeError, ExecutionError, FeedError, MemoryLimitError, SelectionError
from engine.modelfile.reader import crashes_inference


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def test_an_input_whose_byte_count_overflows_int64_is_refused_by_the_memory_guard():
    # Found by the fuzz (a byte flip in a Reshape's shape constant): the attribute precheck's meta tensor
    # for a [2^40, 2^40] float32 input raised torch's "Storage size calculation overflowed" RuntimeError.
    big = 2**40
    shape = helper.make_tensor("shape_value", TensorProto.INT64, [2], [big, big])
    model = _model([helper.make_node("Constant", [], ["shape"], value=shape),
                    helper.make_node("Expand", ["X", "shape"], ["E"], name="expand"),
                    helper.make_node("Softmax", ["E"], ["Y"], name="softmax", axis=1)],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, None])])
    with pytest.raises(MemoryLimitError, match=r"^node 'softmax' \(Softmax\): output 'Y' of shape "
                                               r"\[1099511627776, 1099511627776\] float32 needs ") as err:
        model.run({"X": np.ones(1, np.float32)})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("op, opset, attrs, message", [
    ("Transpose", 18, {}, r"Transpose's input 'data' takes a tensor"),
    # no LayerNormalization in the onnx domain at opset 12 (the engine runs it): onnx's latest schema says
    ("LayerNormalization", 12, {"axis": -1}, r"LayerNormalization's input 'X' takes a tensor"),
])
def test_a_sequence_where_the_op_takes_a_tensor_is_named_in_one_line(op, opset, attrs, message):
    # Found by the fuzz (an op type mutated in onnx's sequence test models): the op's tensor code raised
    # AttributeError ("'list' object has no attribute 'dim'"), which no step error caught.
    inputs = ["seq", "S"] if op == "LayerNormalization" else ["seq"]
    nodes = [helper.make_node("SequenceConstruct", ["X", "X"], ["seq"]),
             helper.make_node(op, inputs, ["Y"], name="n", **attrs)]
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("S", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, None])], opset)
    feeds = {"X": np.ones((2, 3), np.float32), "S": np.ones(3, np.float32)}
    with pytest.raises(ExecutionError, match=rf"^node 'n' \({op}\): input 'seq' is a sequence; {message}$"):
        model.run(feeds)
    with pytest.raises(ExecutionError, match=r"input 'seq' is a sequence"):
        model.gradient("Y", ["X"], [n for n in model.inputs if n != "X"], feeds=feeds)


def test_an_expand_shape_input_declared_2_to_the_40_long_skips_onnx_shape_inference():
    # Found by the fuzz (a dim of onnx's test_expand_shape_model1 mutated): Expand-8's shape inference makes
    # one output dim per declared element of its shape input and did not come back (the load hung).
    def expand(length: int):
        graph = helper.make_graph([helper.make_node("Expand", ["X", "shape"], ["Y"], name="e")], "g",
                                  [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 1]),
                                   helper.make_tensor_value_info("shape", TensorProto.INT64, [length])],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 1])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])

    assert crashes_inference(expand(2**40).graph) and not crashes_inference(expand(3).graph)
    model = engine.load(expand(2**40))  # comes back: inference is skipped
    with pytest.raises(FeedError, match=r"^feed 'shape': expected int64 \[1099511627776\], got int64 \[3\]$"):
        model.run({"X": np.ones((1, 3, 1), np.float32), "shape": np.array([1, 3, 1], np.int64)})
    done = engine.load(expand(3)).run({"X": np.ones((1, 3, 1), np.float32), "shape": np.array([2, 3, 4], np.int64)})
    assert np.asarray(done["Y"] if isinstance(done, dict) else done[0]).shape == (2, 3, 4)


def _pad_2(pads: list[int]):
    # The output declared as the unmutated model had it: onnx's inference then fails on the clash and the
    # memory guard's plan-wide sizing takes the declared [4, 4]; only the step itself knows the size.
    node = helper.make_node("Pad", ["X"], ["Y"], name="pad", mode="reflect", pads=pads)
    return _model([node], [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 4])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 4])], opset=2)


def test_a_pad_2_attribute_past_any_output_dim_is_named_before_the_indices_are_made():
    # Found by the fuzz (test_operator_pad's pads mutated to 2^31 - 1): reflect padding built 2^31 int64
    # indices (16 GiB, over a minute) before the 216 GiB output failed.
    model = _pad_2([0, 0, 2**31 - 1, 0])
    with pytest.raises(BadAttributeError, match=r"^node 'pad' \(Pad\): attribute 'pads' is \[0, 0, 2147483647, 0\], "
                                                r"expected each at most 1073741824"):
        model.run({"X": np.ones((4, 4), np.float32)})


def test_a_pad_2_output_the_machine_cannot_give_is_sized_from_its_attribute():
    # Pads within range whose output is still too big: Pad before opset 11 holds its pads as an attribute,
    # which the guard's per-step sizing read only as an input.
    model = _pad_2([2**20] * 4)
    with pytest.raises(MemoryLimitError, match=r"^node 'pad' \(Pad\): output 'Y' of shape \[2097156, 2097156\] "
                                               r"float32 needs 16\.0 TiB"):
        model.run({"X": np.ones((4, 4), np.float32)})
    padded = _pad_2([1, 0, 0, 2]).run({"X": np.arange(16, dtype=np.float32).reshape(4, 4)})
    got = np.asarray(padded["Y"] if isinstance(padded, dict) else padded[0])
    want = np.pad(np.arange(16, dtype=np.float32).reshape(4, 4), ((1, 0), (0, 2)), mode="reflect")
    np.testing.assert_array_equal(got, want)


def test_a_y_declared_a_tensor_that_computes_a_sequence_is_refused_in_one_line():
    # Found by the fuzz (an op type in onnx's test_sequence_model6 mutated to Identity): the gradient read
    # requires_grad of the list the run gave for y.
    nodes = [helper.make_node("SplitToSequence", ["X"], ["seq"], axis=-1),
             helper.make_node("Identity", ["seq"], ["Y"], name="same")]
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])], opset=12)
    x = {"X": np.ones((2, 3), np.float32)}
    assert len(model.run(x)["Y"]) == 3  # the run gives the sequence as it is
    with pytest.raises(SelectionError, match=r"^y 'Y' is a sequence, not a tensor: gradients need a tensor y$"):
        model.gradient("Y", ["X"], [], feeds=x)


def test_a_derivative_torch_cannot_take_is_one_line():
    # Found by the fuzz (test_operator_pow's exponent typed bool): the forward runs, torch's derivative of
    # Pow subtracts 1 from the bool exponent and raised RuntimeError out of the backward pass.
    model = _model([helper.make_node("Pow", ["X", "E"], ["Y"], name="pow")],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3]),
                    helper.make_tensor_value_info("E", TensorProto.BOOL, [2, 3])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])], opset=13)
    feeds = {"X": np.full((2, 3), 2.0, np.float32), "E": np.array([[True, False, True]] * 2)}
    np.testing.assert_array_equal(model.run(feeds)["Y"], np.where(feeds["E"], 2.0, 1.0))
    with pytest.raises(ExecutionError, match=r"^the backward pass from y 'Y' failed in torch: Subtraction, the `-` "
                                             r"operator, with a bool tensor is not supported\.") as err:
        model.gradient("Y", ["X"], ["E"], feeds=feeds)
    assert "\n" not in str(err.value)
