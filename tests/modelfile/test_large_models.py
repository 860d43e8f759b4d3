"""Models bigger than what is read: weights stay in their files until something uses them.

The >2 GB model is a sparse external data file (no disk is used for its zeros): it loads, runs a
slice, differentiates a small weight beside the big one and saves, and the process's memory grows
by far less than the data's size throughout (the big tensor is never read).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import engine
from engine import GradManager, ModelLoadError
from engine.cli import main as cli
from tests import paths

BIG = 2**31 + 2**20  # bytes of the int8 tensor: over protobuf's 2 GB
W_AT = BIG + 4096  # W's offset in the same data file, past the 2 GB mark


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _external(name: str, data_type: int, dims, location: str, offset: int, length: int) -> TensorProto:
    t = TensorProto()
    t.name, t.data_type = name, data_type
    t.dims.extend(dims)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = t.external_data.add()
        entry.key, entry.value = key, str(value)
    t.data_location = TensorProto.EXTERNAL
    return t


def sparse_model(folder, w: np.ndarray) -> str:
    """Y = X @ W (W: 64x64 float32, stored after the big tensor) and Z = Gather(Big, I), Big an int8
    tensor of BIG bytes that exist only as a hole in weights.bin."""
    big = _external("Big", TensorProto.INT8, [BIG], "weights.bin", 0, BIG)
    wt = _external("W", TensorProto.FLOAT, [64, 64], "weights.bin", W_AT, w.nbytes)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm"), helper.make_node("Gather", ["Big", "I"], ["Z"], name="pick")],
        "sparse", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64]),
                   helper.make_tensor_value_info("I", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64]),
         helper.make_tensor_value_info("Z", TensorProto.INT8, [3])], initializer=[big, wt])
    path = os.path.join(folder, "sparse.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    with open(os.path.join(folder, "weights.bin"), "wb") as fh:
        fh.truncate(W_AT)  # a hole: no block is written
        fh.seek(W_AT)
        fh.write(w.tobytes())
        fh.seek(BIG // 2)
        fh.write(b"\x07")  # one real byte in the middle of Big
    return path


def used_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sparse")
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    path = sparse_model(str(folder), w)
    if used_bytes(os.path.join(folder, "weights.bin")) > 2**24:
        pytest.skip("this filesystem does not keep sparse files sparse")
    return path, w


def test_a_model_over_2gb_loads_runs_and_differentiates_without_reading_its_data(sparse):
    path, w = sparse
    before = rss()
    model = engine.load(path)
    assert model.graph.weights.nbytes("Big") == BIG
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    z = model.run({"X": x, "I": np.array([0, BIG // 2, BIG - 1])}, outputs=["Z"])["Z"]
    np.testing.assert_array_equal(z, [0, 7, 0])  # read through the mapping: only the pages asked for
    res = model.gradient("Y", ["W"], ["X"], feeds={"X": x})
    np.testing.assert_allclose(res.grads["W"], x.T @ np.ones((2, 64), np.float32), rtol=1e-6)
    np.testing.assert_allclose(model.run({"X": x}, outputs=["Y"])["Y"], x @ w, rtol=1e-5)
    assert rss() - before < 300 * 2**20, "the big tensor was read"


def test_a_model_over_2gb_saves_as_external_data_and_stays_sparse(sparse, tmp_path):
    path, w = sparse
    before = rss()
    gm = GradManager(path).attach("W")  # int8 Big is no parameter: only W is cloned
    with gm:
        gm.backward(gm.run({"X": np.ones((2, 64), np.float32), "I": np.zeros(3, np.int64)})["Y"].sum())
    with torch.no_grad():
        gm.params["W"].sub_(0.5 * gm.params["W"].grad)
    assert gm.save(tmp_path / "trained.onnx") is True  # over 2 GB: external data (below), unasked
    assert rss() - before < 300 * 2**20
    data = tmp_path / "trained.onnx.data"
    assert os.path.getsize(data) > BIG and used_bytes(data) < 2**24  # the hole copied as a hole
    reloaded = engine.load(tmp_path / "trained.onnx")
    np.testing.assert_array_equal(reloaded.constants()["W"].numpy(), gm.params["W"].detach().numpy())
    np.testing.assert_array_equal(reloaded.run({"X": np.ones((2, 64), np.float32), "I": np.array([BIG // 2] * 3)},
                                               outputs=["Z"])["Z"], [7, 7, 7])


def test_lower_writes_external_data_when_its_output_is_over_2gb(sparse, tmp_path, capsys):
    path, w = sparse
    out = tmp_path / "lowered.onnx"
    assert cli(["lower", path, "--y", "Y", "--xs", "W", "--zs", "X", "-o", str(out)]) == 0
    assert "external data" in capsys.readouterr().out
    assert used_bytes(str(out) + ".data") < 2**24
    lowered = engine.load(out)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(lowered.run({"X": x, "I": np.zeros(3, np.int64)}, outputs=["dY_dW"])["dY_dW"],
                               x.T @ np.ones((2, 64), np.float32))


def small_external(folder, location: str = "w.bin", data_bytes: int | None = None) -> str:
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    t = _external("W", TensorProto.FLOAT, [64, 64], location, 0, w.nbytes)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])], initializer=[t])
    path = os.path.join(folder, "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    data = w.tobytes()[:data_bytes]
    target = os.path.join(folder, location)
    if os.path.isdir(os.path.dirname(target)):
        with open(target, "wb") as fh:
            fh.write(data)
    return path


@pytest.mark.parametrize("case,message", [
    ("truncated", r"needs 16384 bytes at offset 0 of w\.bin, which holds 100: the file is truncated"),
    ("missing", r"should be stored in .*gone\.bin, but it is not regular file"),
    ("outside", r"points outside the directory"),
    ("absolute", r"should be a relative path"),
    ("symlink", r"is a symbolic link"),
])
def test_bad_external_data_is_refused_in_one_line(tmp_path, case, message):
    inside = tmp_path / "model"
    inside.mkdir()
    if case == "truncated":
        path = small_external(str(inside), data_bytes=100)
    elif case == "missing":
        path = small_external(str(inside), location="gone.bin")
        os.remove(inside / "gone.bin")
    elif case == "outside":
        small_external(str(tmp_path), location="w.bin")
        path = small_external(str(inside), location="../w.bin")
    elif case == "absolute":
        small_external(str(tmp_path), location="w.bin")
        path = small_external(str(inside), location=str(tmp_path / "w.bin"))
    else:
        small_external(str(tmp_path), location="w.bin")
        os.symlink(tmp_path / "w.bin", inside / "link.bin")
        path = small_external(str(inside), location="link.bin")
    with pytest.raises(ModelLoadError, match=message) as err:
        engine.load(path)
    assert "\n" not in str(err.value)


def test_a_folder_holding_one_model_opens_it(tmp_path, capsys):
    path = small_external(str(tmp_path))
    assert engine.load(tmp_path).graph.path == path
    assert cli(["run", str(tmp_path), "--feed", "X=ones"]) == 0
    assert "Y" in capsys.readouterr().out
    onnx.save(onnx.load(path), tmp_path / "other.onnx")
    with pytest.raises(ModelLoadError, match=r"holds 2 \.onnx files \(m\.onnx, other\.onnx\): name one"):
        engine.load(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["grad", str(empty), "--y", "Y", "--xs", "W"]) == 2
    assert "is a folder with no .onnx file in it" in capsys.readouterr().err


def test_weights_are_shared_not_copied(tmp_path):
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 256])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 256])],
                          initializer=[numpy_helper.from_array(w, "W")])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, tmp_path / "inline.onnx")
    external = onnx.ModelProto()
    external.CopyFrom(proto)  # onnx's save rewrites the proto it is given to point at the data file
    onnx.save_model(external, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.bin", size_threshold=0)
    for name in ("inline.onnx", "ext.onnx"):
        model = engine.load(tmp_path / name)
        assert not model.graph.initializers["W"].raw_data  # the proto does not hold the bytes
        const = model.constants()["W"]
        assert const.data_ptr() == model.graph.weights.array("W").ctypes.data  # the tensor is the bytes read
        np.testing.assert_array_equal(const.numpy(), w)
    model = engine.load(proto.SerializeToString())
    np.testing.assert_array_equal(model.constants()["W"].numpy(), w)


def test_onnxgrad_on_a_folder_opens_the_explorer_on_its_model(tmp_path, monkeypatch):
    from explorer import launcher
    from explorer.app import ExplorerApp

    small_external(str(tmp_path))
    opened = []
    monkeypatch.setattr(ExplorerApp, "run", lambda self: opened.append(self.session.label))
    assert launcher.main([str(tmp_path)]) == 0
    assert opened == ["m.onnx"]


@pytest.mark.parametrize("command", [
    ["run", "--feed", "X=ones"],
    ["grad", "--y", "Y", "--xs", "W", "--zs", "X"],
    ["check", "--y", "Y", "--xs", "W", "--zs", "X", "--mode", "fast"],
    ["graph", "--y", "Y", "--xs", "W", "--zs", "X", "--view", "combined", "--stats"],
    ["lower", "--y", "Y", "--xs", "W", "--zs", "X"],
])
def test_every_command_works_on_a_model_with_external_data(tmp_path, command, capsys):
    (tmp_path / "model").mkdir()
    small_external(str(tmp_path / "model"))  # W's bytes in model/w.bin; the command is given the folder
    out = ["-o", str(tmp_path / ("out.onnx" if command[0] == "lower" else "out.txt"))] \
        if command[0] in ("lower", "graph") else []
    assert cli([command[0], str(tmp_path / "model"), *command[1:], *out]) == 0, capsys.readouterr().err
    if command[0] == "lower":
        lowered = engine.load(tmp_path / "out.onnx")
        x = np.ones((2, 64), np.float32)
        np.testing.assert_array_equal(lowered.run({"X": x}, outputs=["dY_dW"])["dY_dW"], x.T @ np.ones((2, 64)))


def test_a_transformers_export_laid_out_as_optimum_does_differentiates_like_torch(tmp_path):
    """A small GPT-2 (random weights) exported by torch, saved as model.onnx + model.onnx_data in a
    folder: opened through the folder, its gradients match torch autograd on the module exported."""
    import sys

    sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
    import _real_models as real_models

    real_models.stub_torchvision()
    pytest.importorskip("transformers")
    module, ids = real_models.build(next(c for c in real_models.CASES if c.name == "gpt2"))
    proto = onnx.load_from_string(real_models.export(module, ids, "torchscript", cache=None))
    onnx.save_model(proto, tmp_path / "model.onnx", save_as_external_data=True, location="model.onnx_data")
    model = engine.load(tmp_path)
    assert model.graph.weights.detached() and all(not model.graph.initializers[n].raw_data
                                                 for n in model.graph.weights.detached())
    matched = real_models.match_weights(model, module)
    assert len(matched) >= 4
    dy = torch.randn(module(ids).shape, generator=torch.Generator().manual_seed(3))
    result = model.gradient(model.outputs[0], sorted(matched), [model.inputs[0]], feeds={model.inputs[0]: ids.numpy()},
                            dy=dy.numpy())
    params = dict(module.named_parameters())
    native = torch.autograd.grad(module(ids), [params[matched[n][0]] for n in sorted(matched)], dy)
    for n, g in zip(sorted(matched), native):
        g = g.t() if matched[n][1] else g
        np.testing.assert_allclose(result.grads[n], g.numpy(), rtol=2e-3, atol=1e-4 * float(g.abs().max()), err_msg=n)


def test_external_data_read_without_mapping_gives_the_same_weights(tmp_path, monkeypatch):
    from engine.modelfile import reader as modelfile

    path = small_external(str(tmp_path))
    mapped = engine.load(path).constants()["W"].numpy()
    monkeypatch.setattr(modelfile, "MAP_EXTERNAL", False)  # as ONNXGRAD_MMAP=0 sets it
    model = engine.load(path)
    assert model.graph.weights._spans["W"].source.map is None
    np.testing.assert_array_equal(model.constants()["W"].numpy(), mapped)


def test_lowering_leaves_a_long_vector_to_plain_shape_inference(monkeypatch):
    """onnx's data propagation spells a 1-D tensor's values as one dimension each: on the >2 GB int8
    table it allocates 24 GB. Such models are inferred without it."""
    from engine.lowering.context import infer_shapes

    asked = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda m, **kw: asked.append(kw) or real(m, **kw))
    g = helper.make_graph([helper.make_node("Gather", ["Big", "I"], ["Z"])], "g",
                          [helper.make_tensor_value_info("Big", TensorProto.INT8, [BIG]),
                           helper.make_tensor_value_info("I", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("Z", TensorProto.INT8, None)])
    inferred = infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert asked == [{}]
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [3]
