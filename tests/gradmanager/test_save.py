"""GradManager.save: only the trained initializers change; the rest of the model is the one loaded, byte for byte."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import engine
from engine import GradManager, ModelLoadError

MLP = "sample_models/mlp.onnx"


def train(gm: GradManager, steps: int = 3) -> None:
    opt = torch.optim.Adam(gm.params.values(), lr=0.05)  # any torch.optim optimizer steps gm.params
    for _ in range(steps):
        with gm:
            gm.backward(gm.run()["logits"].pow(2).mean())
        opt.step()
        opt.zero_grad()


def assert_only_initializers_changed(original: onnx.ModelProto, saved: onnx.ModelProto, gm: GradManager) -> None:
    patched = onnx.ModelProto()
    patched.CopyFrom(saved)
    by_name = {t.name: t for t in original.graph.initializer}
    changed = 0
    for init in patched.graph.initializer:
        if init.name in gm.params:
            value = gm.params[init.name].detach().to(engine.dtypes.onnx_to_torch(init.data_type))
            np.testing.assert_array_equal(numpy_helper.to_array(init), value.float().numpy()
                                          if value.dtype == torch.bfloat16 else value.numpy())
            changed += not np.array_equal(numpy_helper.to_array(init), numpy_helper.to_array(by_name[init.name]))
        else:
            assert init.SerializeToString() == by_name[init.name].SerializeToString()
        init.CopyFrom(by_name[init.name])
    assert patched.SerializeToString() == original.SerializeToString()
    assert changed == len(gm.attached)  # training moved every attached parameter, and they were written


@pytest.mark.parametrize("source", ["path", "bytes", "proto"])
def test_save_writes_the_trained_initializers_and_nothing_else(source, tmp_path):
    original = onnx.load(MLP)
    given = {"path": MLP, "bytes": original.SerializeToString(), "proto": original}[source]
    gm = GradManager(given, dtype="float64").attach(["W1", "b1", "W2", "b2"])
    before = gm.model.run()["loss"]
    train(gm)
    gm.save(tmp_path / "trained.onnx")
    saved = onnx.load(tmp_path / "trained.onnx")
    assert_only_initializers_changed(original, saved, gm)
    assert len(saved.graph.value_info) == 0  # the loader's shape inference is not written back
    np.testing.assert_array_equal(gm.model.run()["loss"], before)  # the Model's own constants untouched
    reloaded = GradManager(tmp_path / "trained.onnx", dtype="float64")
    for n, p in gm.params.items():
        np.testing.assert_array_equal(reloaded.params[n].detach().numpy(), p.detach().float().double().numpy())


def test_save_keeps_float16_and_bfloat16_initializers_in_their_type(tmp_path):
    inits = [numpy_helper.from_array(np.array([0.5, -1.25, 2.0], np.float16), "H")]
    bf = helper.make_tensor("B", TensorProto.BFLOAT16, [3], [0.75, 1.5, -3.0])
    g = helper.make_graph(
        [helper.make_node("Cast", ["H"], ["h32"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["B"], ["b32"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["X", "h32"], ["xh"]), helper.make_node("Mul", ["xh", "b32"], ["Y"])],
        "halves", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])], inits + [bf])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    gm = GradManager(proto, dtype="float64").attach(["H", "B"])
    with gm:
        gm.run({"X": np.array([1.0, 2.0, 3.0], np.float32)})
        gm.backward("Y")
    with torch.no_grad():
        for p in gm.params.values():
            p -= 0.1 * p.grad
    gm.save(tmp_path / "halves.onnx")
    saved = onnx.load(tmp_path / "halves.onnx")
    assert [t.data_type for t in saved.graph.initializer] == [TensorProto.FLOAT16, TensorProto.BFLOAT16]
    assert_only_initializers_changed(proto, saved, gm)


def test_external_data_is_written_inline(tmp_path):
    onnx.save_model(onnx.load(MLP), tmp_path / "ext.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.data", size_threshold=0)
    gm = GradManager(tmp_path / "ext.onnx").attach("W1")
    train(gm, steps=1)
    gm.save(tmp_path / "out.onnx")
    w1 = next(t for t in onnx.load(tmp_path / "out.onnx", load_external_data=False).graph.initializer if t.name == "W1")
    assert w1.data_location == TensorProto.DEFAULT and not w1.external_data
    np.testing.assert_array_equal(numpy_helper.to_array(w1), gm.params["W1"].detach().numpy())


def test_external_data_is_written_when_asked_and_reads_back_as_trained(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)  # 16 KB: over the 1 KB cut
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Add", ["H", "b"], ["Y"])],
                          "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])],
                          initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.ones(64, np.float32), "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    gm = GradManager(tmp_path / "m.onnx").attach("W,b")
    with gm:
        gm.backward(gm.run({"X": np.ones((2, 64), np.float32)})["Y"].pow(2).sum())
    with torch.no_grad():
        for p in gm.params.values():
            p.sub_(0.01 * p.grad)
    assert gm.save(tmp_path / "out.onnx", external_data=True) is True
    inits = {t.name: t for t in onnx.load(tmp_path / "out.onnx", load_external_data=False).graph.initializer}
    assert inits["W"].data_location == TensorProto.EXTERNAL and not inits["W"].raw_data
    assert {e.key: e.value for e in inits["W"].external_data}["location"] == "out.onnx.data"
    assert inits["b"].data_location == TensorProto.DEFAULT  # 256 bytes: under the cut, stays inline
    reloaded = engine.load(tmp_path / "out.onnx")
    for name, value in gm.params.items():
        np.testing.assert_array_equal(reloaded.constants()[name].numpy(), value.detach().numpy())
    assert not np.array_equal(reloaded.constants()["W"].numpy(), w)  # the trained values, not the loaded ones


def test_save_writes_the_model_as_loaded_when_its_small_file_changed_since(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(onnx.load(MLP), path)
    gm = GradManager(path)  # every initializer is under a kilobyte: all of it was read at load
    other = onnx.load(MLP)
    other.graph.initializer[2].dims[:] = [16, 8]
    onnx.save(other, path)
    gm.save(tmp_path / "out.onnx")
    assert_only_initializers_changed(onnx.load(MLP), onnx.load(tmp_path / "out.onnx"), gm)


def test_save_refuses_weights_not_read_yet_from_a_file_rewritten_since(tmp_path):
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])],
                          initializer=[numpy_helper.from_array(w, "W")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = engine.load(path)  # W (16 KB) stays in the file until something reads it
    with open(path, "r+b") as fh:  # rewritten in place, as `onnx.save` over it would
        fh.write(fh.read())
    with pytest.raises(ModelLoadError, match="changed since it was loaded: load it again"):
        GradManager(model).save(tmp_path / "out.onnx")
