"""The ONNX Gradient operator's spec, diagram by diagram, against torch written directly."""
import numpy as np
import torch

import engine
from engine.examples import default_feeds, spec_conv_gemm
from tests import spec_models


def _torch_conv_gemm(x, w, z):
    h = torch.nn.functional.conv2d(x, w)
    return h.flatten(1) @ z


def test_diagram1_conv_gemm_gradient_node_matches_torch():
    model = engine.load(spec_conv_gemm())
    x = default_feeds()["X"]
    out = model.run({"X": x})
    w0, z0 = (torch.from_numpy(model.constants()[n].numpy().copy()).requires_grad_() for n in ("W", "Z"))
    y = _torch_conv_gemm(torch.from_numpy(x), w0, z0)
    gw, gz = torch.autograd.grad(y.sum(), [w0, z0])
    np.testing.assert_allclose(out["Y"], y.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["dY_dW"], gw.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["dY_dZ"], gz.numpy(), rtol=1e-5, atol=1e-6)


def test_diagram1_model_gradient_equals_gradient_node():
    model = engine.load(spec_conv_gemm())
    feeds = default_feeds()
    by_node = model.run(feeds)
    res = model.gradient("Y", ["W", "Z"], ["X"], feeds=feeds)
    np.testing.assert_array_equal(res.grads["W"], by_node["dY_dW"])
    np.testing.assert_array_equal(res.grads["Z"], by_node["dY_dZ"])
    assert res.seed == "ones" and not res.disconnected


def test_diagram2_gradient_wrt_intermediate_fed_with_h1():
    rng = np.random.default_rng(3)
    h1 = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    z1 = rng.standard_normal((8, 3)).astype(np.float32)
    feeds = {"X": rng.standard_normal((1, 1, 4, 4)).astype(np.float32),
             "W": rng.standard_normal((2, 1, 3, 3)).astype(np.float32),
             "Z": z1 * 0, "H_1": h1, "Z_1": z1}
    out = engine.load(spec_models.grad_wrt_h()).run(feeds)
    h, z = torch.from_numpy(h1).requires_grad_(), torch.from_numpy(z1).requires_grad_()
    gh, gz = torch.autograd.grad((h.flatten(1) @ z).sum(), [h, z])
    # The values come from H_1 and Z_1, not from Conv(X, W) or the graph's Z: the graph is cut at xs ∪ zs.
    np.testing.assert_allclose(out["dY_dH"], gh.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["dY_dZ"], gz.numpy(), rtol=1e-5, atol=1e-6)


def test_diagram3_nested_gradient_second_order():
    rng = np.random.default_rng(4)
    x, w, lab = (rng.standard_normal(s) for s in [(2, 3), (3, 2), (2, 2)])
    out = engine.load(spec_models.second_order()).run({"X": x, "W": w, "L": lab}, dtype="float64")
    X, W = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    o = ((X @ W - torch.tensor(lab)) ** 2).sum()
    gx, gw = torch.autograd.grad(o, [X, W], create_graph=True)
    ggx, ggw = torch.autograd.grad(gw.sum(), [X, W])
    np.testing.assert_allclose(out["O"], o.item(), rtol=1e-12)
    np.testing.assert_allclose(out["dO_dX"], gx.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["dO_dW"], gw.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["d2O_dWdX"], ggx.numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["d2O_dW2"], ggw.numpy(), rtol=1e-12)


def test_optional_empty_output_is_skipped():
    m = spec_conv_gemm()
    grad_node = m.graph.node[-1]
    grad_node.output[0] = ""
    del m.graph.output[1]
    out = engine.load(m).run(default_feeds())
    assert set(out) == {"Y", "dY_dZ"}
    np.testing.assert_array_equal(out["dY_dZ"], engine.load(spec_conv_gemm()).run(default_feeds())["dY_dZ"])


def test_shipped_gradient_of_add_tests_pass(onnx_data):
    from onnx import load_tensor, numpy_helper

    for case in ("test_gradient_of_add", "test_gradient_of_add_and_mul"):
        folder = onnx_data / "simple" / case
        model = engine.load(str(folder / "model.onnx"))
        data = folder / "test_data_set_0"
        ins = [numpy_helper.to_array(load_tensor(str(data / f"input_{i}.pb"))) for i in range(2)]
        want = [numpy_helper.to_array(load_tensor(str(data / f"output_{i}.pb"))) for i in range(3)]
        got = model.run(dict(zip(model.inputs, ins)))
        for name, w in zip(model.outputs, want):
            np.testing.assert_array_equal(got[name], w)
