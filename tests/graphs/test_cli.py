"""`onnxgrad graph`: DOT, SVG through the real dot, text; bad input is one line and exit code 2."""
from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import onnx
import pytest

from engine.cli import main
from engine.examples import spec_conv_gemm
from tests.graphs.test_diagrams import grad_wrt_h


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "conv_gemm.onnx"
    onnx.save(spec_conv_gemm(), path)
    return str(path)


def test_dot_to_stdout_and_file(model_path, tmp_path, capsys):
    assert main(["graph", model_path]) == 0
    assert capsys.readouterr().out.startswith("digraph forward {")
    out = tmp_path / "g.dot"
    assert main(["graph", model_path, "--y", "Y", "--xs", "W,Z", "--zs", "X", "--view", "combined", "-o", str(out)]) == 0
    text = out.read_text()
    assert "cluster_bw" in text and "Gradient(xs=[W, Z], zs=[X], y=Y)" in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")
def test_svg_through_real_dot_parses_as_xml(model_path, tmp_path, capsys):
    out = tmp_path / "g.svg"
    assert main(["graph", model_path, "--y", "Y", "--xs", "W", "--zs", "X,Z", "--view", "backward", "--stats",
                 "--feed", "X=random:1", "-o", str(out)]) == 0
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = "".join(root.itertext())
    assert "∂Conv" in text and "‖g‖=" in text and "ConvolutionBackward0" in text


def test_svg_without_dot_says_so_in_one_line(model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("engine.graphs.dot.shutil.which", lambda name: None)
    assert main(["graph", model_path, "-o", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the Graphviz 'dot' program" in err
    assert not (tmp_path / "g.png").exists()


def test_text_output_draws_boxes(tmp_path, capsys):
    path = tmp_path / "h.onnx"
    onnx.save(grad_wrt_h(), path)
    out = tmp_path / "g.txt"
    assert main(["graph", str(path), "--view", "backward", "-o", str(out)]) == 0
    text = out.read_text()
    assert "∂Flatten" in text and "dY/dH" in text and "∂Conv" not in text and "┌" in text


@pytest.mark.parametrize("argv, message", [
    (["--y", "Y"], "give --y and --xs together"),
    (["--view", "backward", "--y", "Y", "--xs", "H", "--zs", "X"], "not an independent variable"),
    (["-o", "g.pdf"], "must end in .dot, .svg, .png or .txt"),
    (["--stats"], "--stats needs a selection"),
    (["--y", "Q", "--xs", "W"], "is not a tensor of this model"),
])
def test_bad_input_is_one_line_exit_2(model_path, capsys, argv, message):
    assert main(["graph", model_path] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_backward_view_of_a_model_without_gradient_nodes_needs_a_selection(tmp_path, capsys):
    path = tmp_path / "plain.onnx"
    onnx.save(spec_conv_gemm(with_gradient=False), path)
    assert main(["graph", str(path), "--view", "backward"]) == 2
    assert "needs a selection" in capsys.readouterr().err
