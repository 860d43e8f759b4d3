"""ONNX's shipped `light/` architectures: forward against onnxruntime and the shipped outputs,
gradients against the same networks written directly in torch (tests/torch_reference.py)."""
import glob
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import engine
from tests import torch_reference

LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))


def _weights(proto, k=3):
    """The first, a middle and the last ConstantOfShape-made weights (intermediates of the graph)."""
    made = [n.output[0] for n in proto.graph.node if n.op_type == "ConstantOfShape"]
    return [made[0], made[len(made) // 2], made[-1]][:k]


def _random_weights(model: engine.Model, proto, seed: int) -> dict[str, np.ndarray]:
    """Random values for every ConstantOfShape weight, scaled so activations stay O(1)."""
    consts = model.constants()
    rng = np.random.default_rng(seed)
    feeds = {}
    for node in proto.graph.node:
        if node.op_type == "ConstantOfShape":
            shape = tuple(int(v) for v in consts[node.input[0]].tolist())
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
            if "var" in node.output[0] or "riv" in node.output[0]:  # BatchNorm variances must be positive
                value = np.abs(value) + 0.5
            feeds[node.output[0]] = value.astype(np.float32)
    return feeds


def _with_random_feeds(stem: str, seed: int):
    """A light model with random weights and a random image: (proto, model, input name, feeds)."""
    path = next(p for p in LIGHT if p.endswith(f"light_{stem}.onnx"))
    proto = onnx.load(path)
    model = engine.load(proto)
    (name,) = model.inputs
    feeds = _random_weights(model, proto, seed=seed)
    feeds[name] = np.random.default_rng(seed + 1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return proto, model, name, feeds


def _weights_as_inputs(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], image: str) -> onnx.ModelProto:
    """onnxruntime cannot override intermediates: the ConstantOfShape weights become graph inputs."""
    cut = onnx.ModelProto()
    cut.CopyFrom(proto)
    keep = [n for n in cut.graph.node if n.op_type != "ConstantOfShape"]
    del cut.graph.node[:]
    cut.graph.node.extend(keep)
    for w, v in feeds.items():
        if w != image:
            cut.graph.input.append(onnx.helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, v.shape))
    return cut


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: os.path.basename(p)[6:-5])
def test_forward_matches_onnxruntime_and_shipped_output(path):
    ort = pytest.importorskip("onnxruntime")
    model = engine.load(path)
    (name,) = model.inputs
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    # The shipped weights are all 0.02: the 1,000 logits are equal in exact arithmetic (7.9e11, an
    # ulp of 65,536), and a GEMM on many threads sums the columns in different orders, so the
    # softmax of logits a few ulps apart is 0 or 1/24 where onnxruntime gives 0.001 everywhere (16
    # cores). One thread sums every column alike, as onnxruntime does.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = model.run({name: x})[model.outputs[0]]
    finally:
        torch.set_num_threads(before)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {name: x})[0], rtol=1e-4, atol=1e-6)
    shipped = numpy_helper.to_array(onnx.load_tensor(path.replace(".onnx", "_output_0.pb")))
    np.testing.assert_allclose(got, shipped, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("stem", ["squeezenet", "shufflenet", "inception_v1", "zfnet512"])
def test_forward_with_random_weights_matches_onnxruntime(stem):
    """Constant weights make every output 0.001; random weights fed as intermediates make the check bite."""
    ort = pytest.importorskip("onnxruntime")
    proto, model, name, feeds = _with_random_feeds(stem, seed=1)
    cut = _weights_as_inputs(proto, feeds, name)
    session = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    got = model.run(feeds)[model.outputs[0]]
    assert np.abs(want).max() > 0.005  # the random weights really changed the output
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["squeezenet", "shufflenet", "inception_v1", "resnet50", "densenet121"])
def test_gradients_match_network_written_in_torch(stem):
    proto, model, name, feeds = _with_random_feeds(stem, seed=3)
    xs = [name] + _weights(proto)
    zs = [w for w in feeds if w not in xs]
    y = model.outputs[0]
    dy = np.random.default_rng(5).standard_normal(model.run(feeds)[y].shape)
    # float64 on both sides: deep nets' input gradients are ~1e-9 here, below float32 round-off.
    res = model.gradient(y, xs, zs, feeds=feeds, dy=dy, dtype="float64")

    leaves = {k: torch.from_numpy(v.astype(np.float64)).requires_grad_(k in xs) for k, v in feeds.items()}
    out = torch_reference.run(proto, leaves, [y], dtype=torch.float64)[y]
    want = torch.autograd.grad(out, [leaves[x] for x in xs], torch.from_numpy(dy))
    for x, w in zip(xs, want):
        g = res.grads[x]
        scale = float(np.abs(w.numpy()).max())
        assert scale > 0, f"oracle gradient for {x} is all zero: the check would be vacuous"
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-7, atol=1e-9 * scale, err_msg=x)
