"""Issue 18's load path: the checker and shape inference never see the weights' bytes, and what is read
back from the skeleton and the spans the wire-level scan found is the file's weights, bit for bit."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import engine
from engine.lowering.build import as_proto
from engine.modelfile.reader import STRIP_BYTES

DTYPES = (np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8)


def identities(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """One output per weight: Identity(weight)."""
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"], name=f"id_{name}") for name in weights]
    outputs = [helper.make_tensor_value_info(f"{name}_out", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
               for name, a in weights.items()]
    g = helper.make_graph(nodes, "weights", [], outputs,
                          initializer=[numpy_helper.from_array(a, name) for name, a in weights.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_checker_and_shape_inference_see_no_weight_bytes(tmp_path, monkeypatch):
    big = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MB inline
    path = tmp_path / "inline.onnx"
    onnx.save(identities({"W": big, "b": np.arange(4, dtype=np.float32)}), path)
    seen = {"check": [], "infer": []}
    check, infer = onnx.checker.check_model, onnx.shape_inference.infer_shapes

    def checking(model, *args, **kwargs):
        seen["check"].append(model.ByteSize() if isinstance(model, onnx.ModelProto) else model)
        return check(model, *args, **kwargs)

    def inferring(model, *args, **kwargs):
        seen["infer"].append(model.ByteSize() if isinstance(model, onnx.ModelProto) else model)
        return infer(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", checking)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", inferring)
    model = engine.load(path)
    assert seen["check"] and seen["infer"]
    assert all(isinstance(size, int) and size < 4096 for size in seen["check"] + seen["infer"]), seen
    np.testing.assert_array_equal(model.run({}, outputs=["W_out"])["W_out"], big)
    assert model.graph.model.ByteSize() < 4096  # the loaded graph's proto holds no weight bytes either


@st.composite
def weight_sets(draw):
    count = draw(st.integers(1, 5))
    out = {}
    for k in range(count):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        # around the size from which initializers leave the proto, and empty ones
        n = draw(st.sampled_from([0, 1, STRIP_BYTES // dtype.itemsize - 1, STRIP_BYTES // dtype.itemsize,
                                  draw(st.integers(0, 3 * STRIP_BYTES // dtype.itemsize))]))
        seed = draw(st.integers(0, 2**16))
        values = np.random.default_rng(seed).standard_normal(n) * 100
        out[f"w{k}"] = values.astype(dtype)
    return out


@settings(max_examples=40, deadline=None)
@given(weights=weight_sets(), from_file=st.booleans())
def test_weights_read_back_are_the_files_bit_for_bit(tmp_path_factory, weights, from_file):
    proto = identities(weights)
    data = proto.SerializeToString()
    if from_file:
        source = tmp_path_factory.mktemp("w") / "m.onnx"
        source.write_bytes(data)
    else:
        source = data
    model = engine.load(source)
    for name, a in weights.items():
        got = model.constants()[name].numpy()
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
        big = a.nbytes >= STRIP_BYTES
        assert (name in model.graph.weights.detached()) == big
        if big:
            assert not model.graph.initializers[name].raw_data
    back = as_proto(model)
    for t, original in zip(back.graph.initializer, proto.graph.initializer):
        assert t.name == original.name
        np.testing.assert_array_equal(numpy_helper.to_array(t), numpy_helper.to_array(original))


def test_a_weight_shorter_than_its_shape_is_refused_in_one_line():
    proto = identities({"W": np.ones(512, np.float32)})
    proto.graph.initializer[0].raw_data = proto.graph.initializer[0].raw_data[:-4]
    with pytest.raises(engine.ModelLoadError) as err:
        engine.load(proto.SerializeToString())
    assert "\n" not in str(err.value) and "W" in str(err.value)
