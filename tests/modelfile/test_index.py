"""Loading: paths with external data, bytes, and one-line refusals of broken graphs."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.errors import ModelLoadError


def _linear(weight):
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])],
                          initializer=[numpy_helper.from_array(weight, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_external_data_is_loaded_from_beside_the_model(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    path = tmp_path / "ext.onnx"
    onnx.save_model(_linear(w), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    model = engine.load(str(path))
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(model.run({"X": x})["Y"], x @ w, rtol=1e-5)
    res = model.gradient("Y", ["W"], ["X"], feeds={"X": x})
    np.testing.assert_allclose(res.grads["W"], x.T @ np.ones((2, 64), np.float32), rtol=1e-6)


def test_bytes_and_proto_load_the_same_model():
    w = np.eye(64, dtype=np.float32)
    proto = _linear(w)
    x = np.arange(128, dtype=np.float32).reshape(2, 64)
    a = engine.load(proto).run({"X": x})["Y"]
    b = engine.load(proto.SerializeToString()).run({"X": x})["Y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, x)


@pytest.mark.parametrize("nodes,message", [
    ([helper.make_node("Relu", ["B"], ["A"]), helper.make_node("Relu", ["A"], ["B"])], "cycle"),
    ([helper.make_node("Relu", ["X"], ["A"]), helper.make_node("Relu", ["X"], ["A"])], "produced more than once"),
    ([helper.make_node("Relu", ["Q"], ["A"])], "reads 'Q', which no node, input or initializer provides"),
])
def test_broken_graphs_are_refused_in_one_line(nodes, message):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match=message) as err:
        engine.load(m, check=False)
    assert "\n" not in str(err.value)


def test_garbage_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\xffnot a protobuf at all" * 10)
    with pytest.raises(ModelLoadError, match="cannot read .*junk.onnx as ONNX") as err:
        engine.load(str(path))
    assert "\n" not in str(err.value)
