"""Start-up: `--help`, `ops`, argument errors and unreadable files answer without importing torch.

Each case runs the console script's `main` in a fresh interpreter and reports which heavy modules
it imported; timings live in benchmarks/bench_cli.py, not here.
"""
import json
import os
import subprocess
import sys

import onnx
import pytest

import engine
from engine.catalog import builtin_ops
from engine.examples import spec_conv_gemm

PROBE = """
import json, sys
from explorer.launcher import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
import engine
print(json.dumps({"code": code, "engine": engine.__file__,
                  "heavy": sorted(m for m in ("torch", "textual") if m in sys.modules)}), file=sys.stderr)
"""


def probe(*argv: str) -> tuple[dict, subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["engine"] == engine.__file__  # the tree under test, not another install
    return report, proc


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("startup")
    (folder / "empty.onnx").write_bytes(b"")
    (folder / "text.onnx").write_text("hello, not a model\n")
    onnx.save(spec_conv_gemm(), str(folder / "spec.onnx"))
    return folder


@pytest.mark.parametrize("argv", [
    ["--help"], ["-h"], ["ops"], ["ops", "--json"], ["check", "--help"], ["explore", "--help"],
    ["frobnicate"], ["grad", "m.onnx", "--y"], ["check", "m.onnx", "--y", "Y", "--xs", "W", "--mode", "slow"],
    ["run", "/no/such/model.onnx"], ["check", "{d}/empty.onnx", "--y", "Y", "--xs", "W"],
    ["run", "{d}/text.onnx"], ["explore", "{d}/empty.onnx"], ["{d}/text.onnx"],
])
def test_no_torch_before_a_command_needs_it(files, argv):
    report, proc = probe(*(a.replace("{d}", str(files)) for a in argv))
    assert report["heavy"] == [], f"{argv} imported {report['heavy']}"
    assert report["code"] in (0, 2)
    if report["code"] == 2:  # the error is one line (plus the probe's own report line)
        assert len(proc.stderr.strip().splitlines()) == 2 and "Traceback" not in proc.stderr


def test_running_a_model_does_import_torch(files):
    # The probe can see torch: without this, a broken probe would pass every case above.
    report, _ = probe("run", str(files / "spec.onnx"), "--feed", "X=ones")
    assert report["code"] == 0 and report["heavy"] == ["torch"]


def test_help_lists_explore_and_the_model_shortcut(files):
    report, proc = probe("--help")
    assert "explore" in proc.stdout and "onnxgrad MODEL.onnx" in proc.stdout


def test_the_op_catalog_read_from_source_is_the_live_registry():
    live = [{"domain": e.domain, "op_type": e.op_type, "since": e.since, "until": e.until, "note": e.note}
            for e in engine.supported_ops()]
    assert builtin_ops() == live and len(live) > 200


def test_the_graph_command_offers_every_view():
    from engine.cli.graph_cmd import VIEWS
    from engine.graphs.view import VIEWS as ENGINE_VIEWS

    assert VIEWS == ENGINE_VIEWS


def test_a_model_path_opens_the_explorer(monkeypatch, files):
    from explorer import launcher
    from explorer.app import ExplorerApp

    opened = []
    monkeypatch.setattr(ExplorerApp, "run", lambda self: opened.append((self.session.label, self.session.seed)))
    assert launcher.main([str(files / "spec.onnx"), "--seed", "4"]) == 0
    cwd = os.getcwd()
    try:
        os.chdir(files)  # a bare existing file name, no .onnx suffix needed
        os.rename("spec.onnx", "spec.model")
        assert launcher.main(["spec.model"]) == 0
    finally:
        os.rename("spec.model", "spec.onnx")
        os.chdir(cwd)
    assert opened == [("spec.onnx", 4), ("spec.model", 0)]


def test_python_dash_m_explorer_is_the_onnxgrad_command(files):
    """`python -m explorer` answers as `onnxgrad` does: help, and a bad file's one-line error."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(engine.__file__))}
    shown = subprocess.run([sys.executable, "-m", "explorer", "--help"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert shown.returncode == 0 and "explore" in shown.stdout and "check" in shown.stdout
    bad = subprocess.run([sys.executable, "-m", "explorer", str(files / "text.onnx")], capture_output=True,
                         text=True, timeout=120, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
