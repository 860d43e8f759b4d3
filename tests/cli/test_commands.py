"""`onnxgrad run | grad | ops`: outputs, files, and one-line errors with exit code 2."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from engine.cli import main
from engine.examples import default_feeds, spec_conv_gemm


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "spec.onnx"
    onnx.save(spec_conv_gemm(), str(path))
    np.save(path.parent / "x.npy", default_feeds()["X"])
    return path


def test_grad_writes_npz_keyed_by_x_names(spec_path, tmp_path, capsys):
    out = tmp_path / "g.npz"
    code = main(["grad", str(spec_path), "--y", "Y", "--xs", "W,Z", "--zs", "X",
                 "--feed", f"X={spec_path.parent / 'x.npy'}", "--out", str(out)])
    assert code == 0
    with np.load(out) as data:
        assert sorted(data.files) == ["W", "Z"]
        import engine

        want = engine.load(str(spec_path)).run(default_feeds())
        np.testing.assert_array_equal(data["W"], want["dY_dW"])
        np.testing.assert_array_equal(data["Z"], want["dY_dZ"])
    assert "dY/dW" in capsys.readouterr().out


def test_grad_notes_each_default_it_chose(spec_path, capsys):
    assert main(["grad", str(spec_path), "--y", "Y", "--xs", "W", "--zs", "X,Z", "--seed", "7"]) == 0
    # X is the first graph input: seed 7 + 1 + 0; W and Z are initializers, not a choice.
    assert capsys.readouterr().err.splitlines() == ["note: X not fed: using random:8"]


def test_run_includes_gradient_node_outputs(spec_path, tmp_path, capsys):
    out = tmp_path / "o.npz"
    assert main(["run", str(spec_path), "--feed", "X=ones", "--out", str(out)]) == 0
    with np.load(out) as data:
        assert sorted(data.files) == ["Y", "dY_dW", "dY_dZ"]
        # dY/dZ[i, j] = H_flat[i] for every output column j (the seed is ones).
        np.testing.assert_array_equal(data["dY_dZ"], np.repeat(data["dY_dZ"][:, :1], 3, axis=1))
        assert np.abs(data["dY_dZ"]).max() > 0


def test_ops_json_lists_registry_and_gradient(capsys):
    assert main(["ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["op_type"] for r in rows}
    assert {"Conv", "Gemm", "Softmax", "LSTM", "Gradient", "Reshape", "ReduceSum"} <= names


@pytest.mark.parametrize("argv,needle", [
    (["run", "missing.onnx"], "no such file: missing.onnx"),
    (["run", "{spec}", "--feed", "X=banana"], "cannot understand 'banana'"),
    (["run", "{spec}", "--feed", "X"], "write NAME=SPEC"),
    (["run", "{spec}", "--feed", "Q=ones"], "feed 'Q' names no tensor"),
    (["run", "{spec}", "--feed", "X=ones", "--device", "tpu"], "unknown device 'tpu'"),
    (["grad", "{spec}", "--y", "Y", "--xs", "H,W", "--zs", "X"], "'H' cannot be in xs: it is determined by 'W' and 'X'"),
    (["grad", "{spec}", "--y", "Y", "--xs", "W"], "depends on 'X'"),
    (["grad", "{spec}", "--y", "Y", "--xs", "W", "--zs", "X", "--dy", "zeros", "--feeds", "nope.npz"], "no such file: nope.npz"),
    (["grad", "{spec}", "--y", "Y"], "the following arguments are required: --xs"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_exit_2(spec_path, capsys, argv, needle):
    argv = [a.replace("{spec}", str(spec_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_console_script_reports_cuda_missing_in_one_line(spec_path):
    proc = subprocess.run([sys.executable, "-m", "engine", "grad", str(spec_path), "--y", "Y", "--xs", "W",
                           "--zs", "X", "--device", "cuda:3"], capture_output=True, text=True, timeout=120)
    import torch

    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a cuda:3")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "cuda:3" in proc.stderr
