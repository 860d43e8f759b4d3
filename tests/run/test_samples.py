"""The sample models: rebuilt byte for byte, runnable, right against independent oracles, and
reaching the verdict each one is meant to teach (pass; fail for the bug twin; inconclusive at kinks)."""
from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import engine
from engine.cli import main as cli_main
from engine.examples import spec_conv_gemm
from engine.gradient.feeds import parse_spec
from tests import paths

ROOT = paths.ROOT
SAMPLES_DIR = ROOT / "sample_models"


def _load_build():
    spec = importlib.util.spec_from_file_location("sample_models_build", SAMPLES_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


build = _load_build()
SAMPLES = {s.name: s for s in build.SAMPLES}
NAMES = list(SAMPLES)


def _path(name: str) -> str:
    return str(SAMPLES_DIR / f"{name}.onnx")


def _initializers(name: str) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(_path(name)).graph.initializer}


def _feeds(sample) -> dict[str, np.ndarray]:
    graph = engine.load(_path(sample.name)).graph
    return {n: parse_spec(graph, n, spec) for n, spec in sample.feeds.items()}


# --- the files ------------------------------------------------------------------------------------
def test_committed_files_match_a_fresh_build():
    fresh = build.build_all()
    on_disk = {p.name for p in SAMPLES_DIR.glob("*.onnx")}
    assert on_disk == set(fresh), "sample_models/ holds .onnx files the build script does not make, or lacks some"
    stale = [f for f, data in fresh.items() if (SAMPLES_DIR / f).read_bytes() != data]
    assert not stale, f"rerun python sample_models/build.py: {stale}"


def test_build_is_deterministic_and_small():
    first, second = build.build_all(), build.build_all()
    assert first == second
    assert all(len(data) < 1_000_000 for data in first.values())


def test_build_check_mode_reports_stale_files(tmp_path, capsys):
    assert build.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert build.main(["--dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--dir", str(tmp_path)]) == 0


def test_spec_sample_is_the_bundled_default_model():
    assert (SAMPLES_DIR / "spec_conv_gemm.onnx").read_bytes() == spec_conv_gemm().SerializeToString()


def test_readme_table_lists_every_sample():
    readme = (SAMPLES_DIR / "README.md").read_text()
    listed = set(re.findall(r"^\| \[`(\w+)\.onnx`\]", readme, flags=re.M))
    assert listed == set(NAMES)


def test_readme_check_commands_are_the_catalogue_selections():
    readme = (SAMPLES_DIR / "README.md").read_text()
    for sample in SAMPLES.values():
        claimed = [f"--claimed {x}={out}" for x, out in sample.claimed.items()]
        command = " ".join(["onnxgrad check", f"sample_models/{sample.filename}", *sample.cli_args(), *claimed])
        assert f"$ {command}" in readme, command


# --- running --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_sample_runs_with_documented_feeds_and_declared_shapes(name):
    sample = SAMPLES[name]
    model = engine.load(_path(name))
    assert set(model.inputs) <= set(sample.feeds), f"README must say how to feed {model.inputs}"
    outputs = model.run(_feeds(sample))
    declared = {o.name: tuple(d.dim_value for d in o.type.tensor_type.shape.dim)
                for o in model.graph.model.graph.output}
    for out_name, value in outputs.items():
        assert value.shape == declared[out_name], out_name
        assert np.isfinite(value).all(), out_name
    result = model.gradient(sample.y, sample.xs, sample.zs, feeds=_feeds(sample))
    assert not result.disconnected
    assert all(np.abs(g).max() > 0 for g in result.grads.values())


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("spec_")])
def test_forward_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # initializers that are inputs are on purpose: quiet the warning
    session = ort.InferenceSession(_path(name), options, providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, {})))
    ours = engine.load(_path(name)).run({})
    for out_name, value in expected.items():
        # float16 (transformer_block_fp16): both sides round every value, onnxruntime too; 16 ulps of the scale.
        atol = 16 * float(np.finfo(np.float16).eps) * np.abs(value).max() if value.dtype == np.float16 else 1e-5
        assert ours[out_name].dtype == value.dtype, out_name
        np.testing.assert_allclose(ours[out_name], value, rtol=1e-5, atol=atol, err_msg=out_name)


# --- the Gradient nodes compute what the spec says ------------------------------------------------
def test_second_order_sample_matches_closed_form():
    out = engine.load(_path("spec_second_order")).run({})
    init = _initializers("spec_second_order")
    x, w, label = (init[k].astype(np.float64) for k in ("X", "W", "L"))
    np.testing.assert_allclose(out["O"], ((x @ w - label) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(out["dO_dW"], 2 * x.T @ (x @ w - label), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["dO_dX"], 2 * (x @ w - label) @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["d2O_dW2"], 2 * x.T @ x @ np.ones((3, 2)), rtol=1e-5, atol=1e-5)
    # The mixed term d(sum dO/dW)/dX, from torch written directly.
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (gw,) = torch.autograd.grad(((xt @ wt - torch.tensor(label)) ** 2).sum(), wt, create_graph=True)
    (mixed,) = torch.autograd.grad(gw.sum(), xt)
    np.testing.assert_allclose(out["d_dO_dW_dX"], mixed.numpy(), rtol=1e-5, atol=1e-5)


def test_grad_wrt_h_sample_is_evaluated_at_h1_not_at_the_computed_h():
    feeds = _feeds(SAMPLES["spec_grad_wrt_h"])
    model = engine.load(_path("spec_grad_wrt_h"))
    out = model.run(feeds, outputs=["H", "dY_dH", "dY_dZ"])
    h1 = _initializers("spec_grad_wrt_h")["H_1"]
    assert not np.allclose(out["H"], h1)
    # The same function written directly in torch, evaluated at H_1.
    h1_t = torch.tensor(h1, requires_grad=True)
    z = torch.tensor(_initializers("spec_grad_wrt_h")["Z"], requires_grad=True)
    y = h1_t.flatten(1) @ z
    dh, dz = torch.autograd.grad(y.sum(), [h1_t, z])
    np.testing.assert_allclose(out["dY_dH"], dh.numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["dY_dZ"], dz.numpy(), rtol=1e-6)


def test_optional_output_sample_skips_the_first_gradient():
    model = engine.load(_path("spec_optional_output"))
    assert model.outputs == ["Y", "dY_dZ"]
    feeds = _feeds(SAMPLES["spec_optional_output"])
    full = engine.load(_path("spec_conv_gemm")).run(feeds)
    np.testing.assert_array_equal(model.run(feeds)["dY_dZ"], full["dY_dZ"])


@pytest.mark.parametrize("name, dx_right", [("handwritten_backward", True), ("handwritten_backward_bug", False)])
def test_handwritten_backward_against_torch(name, dx_right):
    out = engine.load(_path(name)).run({})
    init = _initializers(name)
    w = torch.tensor(init["W"], dtype=torch.float64, requires_grad=True)
    x = torch.tensor(init["X"], dtype=torch.float64, requires_grad=True)
    dw, dx = torch.autograd.grad(torch.tanh(w @ x).sum(), [w, x])
    np.testing.assert_allclose(out["dW"], dw.numpy(), rtol=1e-5, atol=1e-6)
    assert np.allclose(out["dX"], dx.numpy(), rtol=1e-5, atol=1e-6) == dx_right


def test_kink_sample_sits_exactly_on_its_kinks():
    init = _initializers("kinks")
    assert (init["X"] == 0).sum() >= 2  # Relu and Abs at 0
    assert (init["X"] == init["Y"]).sum() >= 2  # Max ties


def test_fanout_gradient_is_the_sum_over_consumers():
    init = _initializers("residual_fanout")
    x = torch.tensor(init["X"], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(init["W"], dtype=torch.float64, requires_grad=True)
    loss = ((torch.tanh(x @ w) @ w + x) ** 2).sum()
    dx, dw = torch.autograd.grad(loss, [x, w])
    result = engine.load(_path("residual_fanout")).gradient("loss", ["X", "W"], dtype="float64")
    np.testing.assert_allclose(result.grads["X"], dx.numpy(), rtol=1e-9)
    np.testing.assert_allclose(result.grads["W"], dw.numpy(), rtol=1e-9)


# --- the verifier's verdicts ----------------------------------------------------------------------
def _require_check():
    check = getattr(engine, "check", None)
    if check is None:
        pytest.skip("engine.check is not available yet")
    return check


@pytest.mark.parametrize("name", NAMES)
def test_check_verdict(name):
    check = _require_check()
    sample = SAMPLES[name]
    kwargs = dict(y=sample.y, xs=sample.xs, zs=sample.zs, feeds=_feeds(sample), seed=0)
    if sample.claimed:
        kwargs["claimed"] = sample.claimed
    report = check(engine.load(_path(name)), **kwargs)
    assert report.verdict == sample.verdict, report.to_json() if hasattr(report, "to_json") else report
    assert report.ok == (sample.verdict == "pass")


@pytest.mark.parametrize("name, exit_code", [("mlp", 0), ("handwritten_backward_bug", 1), ("kinks", 3)])
def test_check_cli_exit_codes(name, exit_code, capsys):
    _require_check()
    sample = SAMPLES[name]
    argv = ["check", _path(name), *sample.cli_args()]
    for x, out in sample.claimed.items():
        argv += ["--claimed", f"{x}={out}"]
    assert cli_main(argv) == exit_code, capsys.readouterr()
