"""Escapes found by the long load-path fuzz with no memory limit (issue 35, benchmarks/fuzz_models.py),
each as the smallest hand-built model that shows it: every one must fail in one line, an OnnxGradError."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import engine
from engine.errors import MemoryLimitError


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
