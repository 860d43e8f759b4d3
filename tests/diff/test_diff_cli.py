"""`onnxgrad diff`: exit codes, the culprit line, JSON's first_divergence, JUnit, one-line bad input."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest

from engine.cli import main
from tests.diff.models import X, chain
from tests.verify_models import SAMPLES


@pytest.fixture()
def pair(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(chain(), a)
    onnx.save(chain(w2_scale=1.01), b)
    np.savez(tmp_path / "feeds.npz", x=X)
    return a, b, tmp_path


def test_diverging_pair_exit_1_json_and_junit(pair, capsys):
    a, b, tmp = pair
    code = main(["diff", str(a), str(b), "--y", "y", "--xs", "W1", "--zs", "x", "--feeds", str(tmp / "feeds.npz"),
                 "--json", str(tmp / "r.json"), "--junit", str(tmp / "r.xml"), "--sort", "graph"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 1, captured.err
    assert out.splitlines()[0].startswith("first divergence: node 'mm2' (MatMul), forward: error ")
    assert "inputs arrived within 0" in out.splitlines()[0]
    report = json.loads((tmp / "r.json").read_text())
    first = report["first_divergence"]
    assert (first["node"], first["where"]) == ("mm2", "forward")
    assert first["error"] > first["tolerance"] > 0
    assert report["ok"] is False and report["a"] == str(a) and report["b"] == str(b)
    suite = ET.parse(tmp / "r.xml").getroot()
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "mm2 (MatMul)" in failed and int(suite.get("failures")) == len(failed)


def test_same_model_float16_exit_0(capsys):
    assert main(["diff", f"{SAMPLES}/mlp.onnx", "--dtype", "float16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no divergence: ") and "as float16" in out


@pytest.mark.parametrize("argv, message", [
    (["diff", "missing.onnx", "--dtype", "float16"], "missing.onnx"),
    (["diff", "A", "B", "--dtype", "float16"], "dtype float16 compares one model with itself"),
    (["diff", "A", "B", "--against", "onnxruntime"], "against onnxruntime compares one model with itself"),
    (["diff", "A"], "needs a second model"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys, pair):
    a, _, _ = pair
    argv = [str(a) if x in ("A", "B") else x for x in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_y_not_in_a_exit_2(pair, capsys):
    a, b, _ = pair
    assert main(["diff", str(a), str(b), "--y", "nope", "--xs", "W1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'nope' is not a tensor of A" in err and len(err.splitlines()) == 1


def test_html_and_node_data_files_are_written(pair, capsys):
    from engine.modeldiff.html import DIVERGING

    a, b, tmp = pair
    code = main(["diff", str(a), str(b), "--feeds", str(tmp / "feeds.npz"), "--json", str(tmp / "r.json"),
                 "--html", str(tmp / "r.html"), "--node-data", str(tmp / "nd.json")])
    assert code == 1
    culprit = json.loads((tmp / "r.json").read_text())["first_divergence"]["node"]
    page = (tmp / "r.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html>") and "<svg" in page and "http://" not in page
    assert culprit in page and DIVERGING in page  # the culprit is drawn, in the diverging colour
    (graph,) = json.loads((tmp / "nd.json").read_text()).values()
    over = {node for node, r in graph["results"].items() if r["value"] > 1}
    assert over == {culprit}
