"""onnxgrad check as a CI gate: exit codes, one-line errors, JSON and JUnit files."""
import json
import subprocess
import sys
from xml.etree import ElementTree as ET

import numpy as np
import onnx
import pytest

from engine import examples
from engine.cli import main
from tests.verify_models import SAMPLES


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "spec.onnx"
    onnx.save(examples.spec_conv_gemm(), str(path))
    return str(path)


def test_pass_exits_0_and_writes_the_documented_json_and_junit(spec_path, tmp_path, capsys):
    out_json, out_xml = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["check", spec_path, "--y", "Y", "--xs", "W,Z", "--zs", "X", "--feed", "X=random:1",
                 "--json", str(out_json), "--junit", str(out_xml)])
    assert code == 0
    assert "verdict: PASS" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["ok"] is True and data["verdict"] == "pass" and data["mode"] == "full" and data["seed"] == 0
    assert [r["name"] for r in data["results"]] == ["W", "Z"]
    for r in data["results"]:
        assert r["status"] == "pass" and len(r["worst_index"]) == len(r["shape"])
        assert isinstance(r["analytic"], float) and isinstance(r["numeric"], float) and r["max_abs_err"] < 1e-6
    suite = ET.parse(out_xml).getroot()
    assert suite.tag == "testsuite" and len(suite.findall("testcase")) == 2


def test_a_wrong_claimed_gradient_exits_1_and_junit_records_the_failure(tmp_path, capsys):
    out_xml = tmp_path / "r.xml"
    code = main(["check", f"{SAMPLES}/handwritten_backward_bug.onnx", "--y", "y", "--xs", "W,X",
                 "--claimed", "X=dX", "--claimed", "W=dW", "--mode", "fast", "--junit", str(out_xml)])
    assert code == 1
    assert "FAIL" in capsys.readouterr().out
    failures = ET.parse(out_xml).getroot().findall("testcase/failure")
    assert len(failures) == 1


def test_kinks_exit_3_and_json_to_stdout(capsys):
    code = main(["check", f"{SAMPLES}/kinks.onnx", "--y", "loss", "--xs", "X,Y", "--json", "-"])
    assert code == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "inconclusive"
    assert "verdict: INCONCLUSIVE" in captured.err


@pytest.mark.parametrize("argv, fragment", [
    (["--y", "Y", "--xs", "W,Q", "--zs", "X"], "'Q' is not a tensor"),
    (["--y", "Y", "--xs", "W", "--zs", "X,Z", "--mode", "exhaustive"], "invalid choice"),
    (["--y", "Y", "--xs", "W", "--zs", "X,Z", "--claimed", "W"], "X=OUT"),
    (["--y", "Y", "--xs", "W", "--zs", "X,Z", "--rtol", "-1"], "rtol"),
    (["--y", "Y", "--xs", "W", "--zs", "X,Z", "--json", "/no/such/dir/r.json"], "does not exist"),
    (["--y", "Y", "--xs", "W", "--zs", "X,Z", "--feed", "X=nonsense"], "cannot understand"),
])
def test_bad_input_exits_2_with_one_line(spec_path, argv, fragment, capsys):
    code = main(["check", spec_path] + argv)
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_console_script_in_a_subprocess_has_no_progress_bar_when_not_a_tty(spec_path):
    proc = subprocess.run([sys.executable, "-m", "engine", "check", spec_path, "--y", "Y", "--xs", "W",
                           "--zs", "X,Z", "--mode", "fast", "--seed", "3", "--feed", "X=random:1"],  # no default note
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "mode fast (1 direction)" in proc.stdout and "seed 3" in proc.stdout


def test_a_missing_model_file_exits_2(capsys):
    assert main(["check", "/no/such/model.onnx", "--y", "Y", "--xs", "W"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_feeds_file_and_dy_spec_are_used(spec_path, tmp_path, capsys):
    feeds = tmp_path / "f.npz"
    np.savez(feeds, X=np.ones((1, 1, 4, 4), np.float32))
    assert main(["check", spec_path, "--y", "Y", "--xs", "W,Z", "--zs", "X", "--feeds", str(feeds), "--dy", "ones",
                 "--mode", "sample", "--samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "dy given" in out and "(4 samples)" in out
