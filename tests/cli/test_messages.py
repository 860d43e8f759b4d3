"""CLI messages a new user meets: each says what is wrong with which value, in one line with exit code 2."""
import difflib
import re

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine import load
from engine.cli import main
from engine.examples import spec_conv_gemm
from tests import paths

MLP_PATH = str(paths.ROOT / "sample_models" / "mlp.onnx")
MLP = load(MLP_PATH)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("messages")
    onnx.save(spec_conv_gemm(), str(d / "spec.onnx"))
    (d / "empty.onnx").write_bytes(b"")
    (d / "text.npy").write_text("1 2 3\n")
    (d / "text.npz").write_text("1 2 3\n")
    # Y = Relu(A); X feeds another output only, so dY/dX is structurally zero.
    g = helper.make_graph(
        [helper.make_node("Relu", ["A"], ["Y"]), helper.make_node("Neg", ["X"], ["U"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("A", "X")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("Y", "U")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(d / "disconnected.onnx"))
    return d


GRAD = ["grad", "{d}/spec.onnx", "--y", "Y", "--zs", "X"]


@pytest.mark.parametrize("argv,needle", [
    (["check", "{d}/spec.onnx", "--y", "Y", "--xs", "W", "--zs", "X", "--dy", "zeros:3"],
     "--dy (the seed for y 'Y': shape [1, 3], float32): cannot understand 'zeros:3'"),
    (["run", "{d}/spec.onnx", "--feed", "X={d}/text.npy"], "feed 'X': {d}/text.npy is not an .npy file"),
    (["run", "{d}/spec.onnx", "--feeds", "{d}/text.npz"], "{d}/text.npz is not an .npz file"),
    (["run", "{d}/empty.onnx"], "{d}/empty.onnx is empty: not an ONNX model"),
    (GRAD + ["--xs", "W9"], "xs member 'W9' is not a tensor of this model (did you mean 'W'?)"),
    (["grad", MLP_PATH, "--y", "loss", "--xs", "W9", "--zs", "X,T"], "(did you mean 'W1', 'W2'?)"),
    (["grad", MLP_PATH, "--y", "LOSS", "--xs", "W1", "--zs", "X,T"], "(did you mean 'loss'?)"),
    (GRAD[:3] + ["Y9", "--xs", "W", "--zs", "X"], "y 'Y9' is not a tensor of this model (did you mean 'Y'?)"),
    (GRAD[:5] + ["X9", "--xs", "W"], "zs member 'X9' is not a tensor of this model (did you mean 'X'?)"),
    (GRAD + ["--xs", "W", "--feed", "W9=ones"], "feed 'W9' names no tensor in this model (did you mean 'W'?)"),
    (["run", "{d}/spec.onnx", "--feed", "X=ones", "--output", "H_flt"],
     "output 'H_flt' is not a tensor of this model (did you mean 'H_flat'?)"),
    (["check", "{d}/spec.onnx", "--y", "Y", "--xs", "W", "--zs", "X", "--claimed", "W=dY_dW9"],
     "claimed gradient 'dY_dW9' (for 'W') is not a tensor of this model (did you mean 'dY_dW', 'dY_dZ'?)"),
    (["graph", "{d}/spec.onnx", "--y", "Y", "--xs", "W9", "--zs", "X"], "(did you mean 'W'?)"),
])
def test_bad_values_are_named_in_one_line(files, capsys, argv, needle):
    assert main([a.replace("{d}", str(files)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert needle.replace("{d}", str(files)) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_one_character_slip_is_suggested(data):
    graph = MLP.graph
    names = [n for n in graph.all_tensors() if len(n) >= 2]
    name = data.draw(st.sampled_from(names))
    at = data.draw(st.integers(0, len(name) - 1))
    slip = name[:at] + data.draw(st.sampled_from("#@%~")) + name[at + 1:]
    hint = graph.did_you_mean(slip)
    suggested = re.findall(r"'([^']+)'", hint)
    assert suggested and set(suggested) <= set(graph.all_tensors())
    # The slipped name is suggested unless three others are at least as close.
    ratio = difflib.SequenceMatcher(None, slip, name).ratio()
    rivals = [n for n in graph.all_tensors() if n != name and difflib.SequenceMatcher(None, slip, n).ratio() >= ratio]
    assert name in suggested or len(rivals) >= 3


def test_a_pass_with_nothing_perturbed_says_why(files, capsys):
    assert main(["check", str(files / "disconnected.onnx"), "--y", "Y", "--xs", "A,X"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["PASS", "X"])
    assert "0/6 elements" in lines[at] and "y does not depend on 'X'" in lines[at + 1]


def test_graph_text_with_stats_keeps_the_stats(files, tmp_path, capsys):
    out = tmp_path / "g.txt"
    assert main(["graph", str(files / "spec.onnx"), "--y", "Y", "--xs", "W", "--zs", "X", "--stats",
                 "--feed", "X=ones", "--view", "backward", "-o", str(out)]) == 0
    text = out.read_text()
    table = text[text.index("gradient stats, dY/d(tensor):"):].splitlines()[1:]
    rows = {line.split()[0]: line for line in table}
    assert set(rows) == {"Y", "H_flat", "H", "W"}
    assert "[1×3]" in rows["Y"] and "min=1 max=1" in rows["Y"]  # dY/dY is the ones seed
    want = load(str(files / "spec.onnx")).gradient("Y", ["W"], ["X"], feeds={"X": np.ones((1, 1, 4, 4), np.float32)})
    assert f"[2×1×3×3] ‖g‖={np.linalg.norm(want.grads['W']):.4g}" in rows["W"]
