"""Escapes found by fuzzing the load path (issue 18): strings that are not UTF-8 and steps that run
out of memory become one-line errors; a seeded fuzz of the load path stays in the suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import engine
from engine.errors import BadAttributeError, ExecutionError, ModelLoadError, OnnxGradError
from tests import paths

ROOT = str(paths.ROOT)
SPEC = os.path.join(ROOT, "sample_models", "spec_conv_gemm.onnx")


def garbled(path: str, old: bytes, new: bytes) -> bytes:
    """The model's bytes with every `old` replaced by `new` (same length: the protobuf stays valid)."""
    assert len(old) == len(new)
    with open(path, "rb") as fh:
        data = fh.read()
    assert old in data
    return data.replace(old, new)


@pytest.mark.parametrize("old,new,message", [
    (b"\x4a\x01W", b"\x4a\x01\xff", r"attribute 'xs' is not UTF-8: b'\\xff'"),  # the Gradient node's xs
    (b"\x1a\x04conv", b"\x1a\x04c\xffnv", r"graph: node 0: a name is not UTF-8: b'c\\xffnv'"),  # a node's name
    (b"\x0a\x01H", b"\x0a\x01\x80", r"graph: node 1: a name is not UTF-8: b'\\x80'"),  # a tensor read by a node
    (b"kernel_shape", b"kernel\xfeshape", r"an attribute name is not UTF-8: b'kernel\\xfeshape'"),
])
def test_strings_that_are_not_utf8_are_refused_in_one_line(old, new, message):
    with pytest.raises(ModelLoadError, match=message) as err:
        engine.load(garbled(SPEC, old, new))
    assert "\n" not in str(err.value)


def test_an_external_data_key_that_is_not_utf8_is_refused(tmp_path):
    w = np.ones((64, 64), np.float32)
    g = helper.make_graph([helper.make_node("Relu", ["W"], ["Y"])], "g", [],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [64, 64])],
                          initializer=[onnx.numpy_helper.from_array(w, "W")])
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx",
                    save_as_external_data=True, location="wdata", size_threshold=0)
    (tmp_path / "m.onnx").write_bytes(garbled(str(tmp_path / "m.onnx"), b"wdata", b"w\xffata"))
    with pytest.raises(ModelLoadError, match=r"initializer 'W': an external data entry is not UTF-8"):
        engine.load(tmp_path / "m.onnx")


def _one_node(node, inputs, outputs, initializer=()):
    g = helper.make_graph([node], "g", inputs, outputs, initializer=list(initializer))
    return engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def test_a_step_out_of_memory_names_the_node_the_output_and_the_size_asked_for():
    # ConstantOfShape with a shape no machine holds: the memory guard sizes it from the shape fed, before
    # torch's allocator is asked (tests/run/test_memory_guard.py fakes the machine's memory).
    model = _one_node(helper.make_node("ConstantOfShape", ["S"], ["Y"], name="fill"),
                      [helper.make_tensor_value_info("S", TensorProto.INT64, [2])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, None])])
    with pytest.raises(ExecutionError, match=r"^node 'fill' \(ConstantOfShape\): output 'Y' of shape "
                                             r"\[4194304, 8388608\] float32 needs 128\.0 TiB "
                                             r"\(140737488355328 bytes\), more than the .* the machine can still give$"):
        model.run({"S": np.array([2**22, 2**23], np.int64)})


def test_a_corrupted_axis_is_one_line_naming_the_attribute_before_any_allocation():
    # The axis made LayerNormalization's reduction list 2**40 long (a MemoryError); its validator refuses it first.
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])
    model = _one_node(helper.make_node("LayerNormalization", ["X", "S"], ["Y"], name="ln", axis=-(2**40)), [x],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
                      [onnx.numpy_helper.from_array(np.ones(4, np.float32), "S")])
    with pytest.raises(OnnxGradError, match=r"^node 'ln' \(LayerNormalization\): attribute 'axis' is -1099511627776, "
                                            r"expected in \[-2, 1\]") as err:
        model.run({"X": np.ones((2, 4), np.float64).astype(np.float32)})
    assert "\n" not in str(err.value)


def test_a_memory_error_without_a_message_is_one_line_naming_the_node():
    from types import SimpleNamespace

    from engine.run.step_errors import step_error

    err = step_error(SimpleNamespace(name="ln", op_type="LayerNormalization"), MemoryError())
    assert isinstance(err, ExecutionError)
    assert str(err) == "node 'ln' (LayerNormalization) ran out of memory (the size asked for is not known)"


def test_the_seeded_load_path_fuzz_finds_no_escape():
    """Byte- and proto-level mutations of every sample model, then load, run and gradient: each
    either works or fails with a one-line OnnxGradError (tests/load_fuzz.py; in a child process
    with a memory cap, since a mutated shape may ask for anything)."""
    cmd = [sys.executable, os.path.join(ROOT, "tests", "load_fuzz.py"), "--bytes", "120", "--protos", "120",
           "--seed", "18", "--memory-gb", "4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["escapes"] == [], summary["escapes"][:5]
    assert summary["cases"] == 240
    assert summary["loaded"] > 20 and summary["refused"] > 20  # both paths exercised


def test_an_attribute_that_divides_by_zero_is_one_line_naming_the_node():
    # Found by the fuzz: MaxPool strides of 0 pass the checker; the output size divides by them.
    model = _one_node(helper.make_node("MaxPool", ["X"], ["Y"], name="pool", kernel_shape=[2, 2], strides=[0, 0]),
                      [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 4, 4])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, None, None, None])])
    with pytest.raises(BadAttributeError, match=r"^node 'pool' \(MaxPool\): attribute 'strides' is \[0, 0\], expected each "
                                                r"in \[1, 2147483647\]"):
        model.run({"X": np.ones((1, 1, 4, 4), np.float32)})


def test_a_gradient_node_with_an_empty_input_is_refused_at_load():
    # Found by the fuzz: an xs member's input left empty ran the node with no value for it.
    model = onnx.load(os.path.join(ROOT, "sample_models", "spec_optional_output.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "Gradient")
    node.input[1] = ""
    with pytest.raises(engine.SelectionError, match=r"^Gradient node 'gradient' has no input for 'Z': every member"):
        engine.load(model)


def test_a_doc_string_that_is_not_utf8_is_kept_as_it_is_from_bytes_or_a_proto():
    # Found by the fuzz: no part of the engine reads doc strings, but copying one must not fail.
    proto = onnx.load(os.path.join(ROOT, "sample_models", "mlp.onnx"))
    proto.graph.MergeFromString(b"\x52\x04caf\xe9")  # GraphProto.doc_string (field 10), not UTF-8
    for source in (proto, proto.SerializeToString()):
        model = engine.load(source)
        assert model.graph.source.graph.doc_string == b"caf\xe9"  # protobuf hands it out as bytes
        assert model.run({"X": np.ones((4, 8), np.float32), "T": np.zeros((4, 3), np.float32)})["loss"].shape == ()
