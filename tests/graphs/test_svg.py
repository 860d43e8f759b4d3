"""Big graphs are drawn from onnxgrad's own layout (`neato -n2`), small ones by dot as before.

What runs is recorded at the subprocess boundary: the programs Graphviz is asked to run, with
their arguments. The drawing is parsed as SVG and holds every node and edge of the view.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import onnx
import pytest

import engine
import engine.graphs.svg as svg
from engine.cli import main
from engine.cli.common import Stages
from engine.examples import spec_conv_gemm
from engine.graphs.view import build_view
from tests.big_models import residual_chain

pytestmark = pytest.mark.skipif(shutil.which("neato") is None or shutil.which("dot") is None,
                                reason="needs Graphviz dot and neato")
SVG = "{http://www.w3.org/2000/svg}"
BLOCKS = 100  # 401 forward nodes: just past PLACED_FROM_NODES


@pytest.fixture()
def programs(monkeypatch):
    """The Graphviz programs run, as (name, arguments)."""
    ran = []
    real = subprocess.run

    def recording(cmd, *args, **kwargs):
        ran.append((cmd[0].rsplit("/", 1)[-1], cmd[1:]))
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording)
    return ran


@pytest.fixture(scope="module")
def chain_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("chain") / "chain.onnx"
    onnx.save(residual_chain(BLOCKS), path)
    return str(path)


def drawn(path):
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    groups = list(root.iter(f"{SVG}g"))
    return ({g.get("id") for g in groups if g.get("class") == "node"},
            [g for g in groups if g.get("class") == "edge"], [g for g in groups if g.get("class") == "cluster"])


def test_a_big_view_is_placed_by_onnxgrad_and_drawn_by_neato(chain_path, tmp_path, programs, capsys):
    out = tmp_path / "g.svg"
    selection = ["--y", "loss", "--xs", f"block{BLOCKS - 1}.conv.weight", "--zs", "input"]
    assert main(["graph", chain_path, *selection, "--view", "combined", "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert "placed by onnxgrad's layered layout (400 nodes or more)" in said.out and said.err == ""
    assert [name for name, _ in programs] == ["neato"] and programs[0][1][0] == "-n2"
    model = engine.load(chain_path)
    view = build_view(model, model.selection("loss", [f"block{BLOCKS - 1}.conv.weight"], ["input"]), "combined")
    nodes, edges, clusters = drawn(out)
    assert nodes == {n.id for n in view.nodes}
    assert len(edges) == len(view.edges) and len(clusters) == 1


def test_the_backward_cluster_stands_beside_the_forward_graph(chain_path):
    model = engine.load(chain_path)
    view = build_view(model, model.selection("loss", [f"block{BLOCKS - 2}.conv.weight"], ["input"]), "combined")
    laid = svg.placed_layout(view)
    inside = {n.id for n in view.nodes if n.cluster == "cluster_bw"}
    backward = [n for n in laid.nodes if n.id in inside]
    forward = [n for n in laid.nodes if n.id not in inside]
    assert backward and min(n.x for n in backward) > max(n.x + n.width for n in forward)
    for n in laid.nodes:  # boxes fit their labels (the terminal's cut them at 28 characters)
        assert n.width >= len(n.label) * svg.CHAR_CELLS


def test_small_views_are_still_laid_out_by_dot(tmp_path, programs, capsys):
    path = tmp_path / "spec.onnx"
    onnx.save(spec_conv_gemm(), path)
    assert main(["graph", str(path), "--view", "combined", "-o", str(tmp_path / "g.svg")]) == 0
    assert [name for name, _ in programs] == ["dot"]
    assert "placed" not in capsys.readouterr().out


def test_a_view_dot_runs_out_of_time_on_is_placed_instead(tmp_path, programs, capsys, monkeypatch):
    monkeypatch.setattr(svg, "DOT_WAIT_S", 1e-4)
    path = tmp_path / "spec.onnx"
    onnx.save(spec_conv_gemm(), path)
    out = tmp_path / "g.svg"
    assert main(["graph", str(path), "--view", "combined", "-o", str(out)]) == 0
    assert [name for name, _ in programs] == ["dot", "neato"]
    assert "dot ran out of time" in capsys.readouterr().out
    nodes, _, _ = drawn(out)
    assert nodes == {n.id for n in build_view(engine.load(str(path)), None, "combined").nodes}


def test_without_neato_a_big_view_is_one_line_and_exit_2(chain_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(svg.shutil, "which", lambda name: None)
    assert main(["graph", chain_path, "-o", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs Graphviz's 'neato' program" in err


def test_a_quoted_string_longer_than_graphviz_reads_is_joined_from_pieces(tmp_path):
    label = "x" * 40_000  # Graphviz's lexer stops at 16,384 characters in one quoted string
    quoted = svg._quote(label)
    assert all(len(piece) <= svg.QUOTED_MAX + 2 for piece in quoted.split(" + "))
    done = subprocess.run(["neato", "-n2", "-Tsvg"], input=f'digraph G {{ a [label={quoted} pos="0,0!"] }}'.encode(),
                          capture_output=True)
    assert done.returncode == 0 and label in done.stdout.decode()


def test_stages_show_on_a_terminal_only_and_after_a_while(monkeypatch):
    with Stages() as stage:  # pytest's stderr is no terminal: nothing is started
        stage("loading")
        assert stage._timer is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with Stages(after=0.05) as stage:
        stage("loading")
        assert stage._status is None  # quick commands print nothing
        time.sleep(0.3)
        stage("drawing")
        assert stage._status is not None and stage.text == "drawing"
    assert stage._status is None


def test_graph_names_each_stage_of_a_big_view_while_it_runs(chain_path, tmp_path, monkeypatch):
    """What the spinner shows after a second (above): the command's stages, the placement and the
    drawing of a big view among them, each named before it starts."""
    import engine.cli.graph_cmd as graph_cmd

    named = []

    class Recorded(Stages):
        def __call__(self, text):
            named.append(text)
            super().__call__(text)

    monkeypatch.setattr(graph_cmd, "Stages", Recorded)
    selection = ["--y", "loss", "--xs", f"block{BLOCKS - 1}.conv.weight", "--zs", "input"]
    assert main(["graph", chain_path, *selection, "--view", "combined", "-o", str(tmp_path / "g.svg")]) == 0
    assert named[0] == "loading chain.onnx" and named[1] == "building the combined view"
    assert named[2].endswith("nodes (onnxgrad's layered placement)") and named[3].endswith("with Graphviz neato -n2")
