"""The tool-export oracles' own pieces (benchmarks/_tool_references*.py): the int4 dequantization
against onnxruntime's MatMulNBits, and reference_errors on a hand-built case."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests import paths

sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
from _tool_references import Float64Islands, dequantized_weights, fingerprint  # noqa: E402
from _tool_references_check import StaleReference, reference_errors  # noqa: E402


def matmul_nbits_model(k: int, n: int, block: int, zero_points: bool, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    packed = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    inits = [numpy_helper.from_array(packed, "w_q4"), numpy_helper.from_array(scales, "w_scales")]
    inputs = ["x", "w_q4", "w_scales"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, n * -(-blocks // 2), dtype=np.uint8), "w_zp"))
        inputs.append("w_zp")
    node = helper.make_node("MatMulNBits", inputs, ["y"], "/model/layers.0/mlp/up_proj/MatMul_Q4", domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("k, zero_points", [(64, False), (40, True), (40, False)])
def test_dequantized_weights_match_onnxruntime(tmp_path, k, zero_points):
    """x @ the dequantized weight is onnxruntime's float MatMulNBits (K not a multiple of the block too)."""
    model = matmul_nbits_model(k, 24, 16, zero_points, seed=k)
    onnx.save(model, tmp_path / "m.onnx")
    w = dequantized_weights(tmp_path / "m.onnx")["model.layers.0.mlp.up_proj"].numpy()
    x = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert w.shape == (k, 24)
    np.testing.assert_allclose(x.astype(np.float64) @ w, want, rtol=1e-5, atol=1e-5)


def write_tanh_case(folder, scale: float) -> None:
    """y = tanh(x @ W): case.json, feeds.npz and a torch-autograd reference.npz (times `scale`)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])], [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.savez(folder / "feeds.npz", x=x)
    (folder / "case.json").write_text(json.dumps({"model": "model.onnx", "y": "y", "xs": ["x"], "zs": []}))
    leaf = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(leaf @ torch.tensor(w, dtype=torch.float64))
    dy = torch.from_numpy(rng.standard_normal((3, 5)))
    (grad,) = torch.autograd.grad(y, [leaf], dy)
    np.savez(folder / "reference.npz", y=y.detach().numpy(), dy=dy.numpy(), fingerprint=np.array(fingerprint(folder)),
             **{"grad:x": scale * grad.numpy()})


@pytest.mark.parametrize("scale, passed", [(1.0, True), (1.001, False)])
def test_reference_errors_measure_the_engine_against_the_reference(tmp_path, scale, passed):
    write_tanh_case(tmp_path, scale)
    r = reference_errors(tmp_path)
    assert r["passed"] is passed
    assert r["worst_x"] == "x" and r["y"] < 1e-12
    assert r["worst"] == pytest.approx(abs(1 - 1 / scale), abs=1e-12)


def test_float64_islands_keep_float64_through_float32_casts():
    """HF's RMSNorm casts to float32 whatever its dtype: under the mode the float64 pass stays float64
    (its value is the float64 computation, not float32's) and autograd still flows."""
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    with Float64Islands():
        h = x.to(torch.float32)
        rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        positions = torch.arange(3).float()
        const = torch.ones(2, dtype=torch.float32).float()
        typed = x.type(torch.float32)
    assert h.dtype == positions.dtype == typed.dtype == torch.float64 and const.dtype == torch.float32
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rms, want, rtol=1e-15, atol=1e-15)
    (g,) = torch.autograd.grad(rms.sum(), [x])
    assert g.dtype == torch.float64 and torch.isfinite(g).all()


def test_reference_errors_refuse_a_reference_of_another_build(tmp_path):
    write_tanh_case(tmp_path, 1.0)
    np.savez(tmp_path / "feeds.npz", x=np.zeros((3, 4), np.float32))
    with pytest.raises(StaleReference, match="another build"):
        reference_errors(tmp_path)
