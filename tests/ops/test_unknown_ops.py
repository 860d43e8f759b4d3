"""A model with an op the registry does not know: it loads, everything that avoids the op runs,
what reaches it fails in one line naming op and node, and `--ops FILE.py` registers the op."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.cli import main
from engine.errors import UnsupportedOpError

from ..feed_models import custom_op_model


def x_default() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)  # random:1, the CLI's default



def _one_line_naming_the_op(text: str) -> None:
    assert len(text.strip().splitlines()) == 1 and len(text) < 300, text
    assert "com.example::MyCustomOp" in text and "'custom'" in text


def test_the_model_loads_and_names_its_unsupported_node():
    model = engine.load(custom_op_model())
    bad = model.unsupported_nodes()
    assert list(bad) == [model.graph.node_names.index("custom")]
    _one_line_naming_the_op(bad[1])
    assert "custom" in model.unsupported_summary()


def test_runs_and_gradients_that_avoid_the_op_work():
    model = engine.load(custom_op_model())
    x = x_default()
    np.testing.assert_allclose(model.run({"X": x}, outputs=["Z"])["Z"], np.tanh(x) * 0.5, rtol=1e-6)
    grad = model.gradient("Z", ["A"], feeds={"X": x})
    np.testing.assert_allclose(grad.grads["A"], np.full((2, 3), 0.5), rtol=1e-6)
    below = model.gradient("C", ["B"])  # B's forward value needs the op: it takes a seeded default
    np.testing.assert_allclose(below.grads["B"], np.full((2, 3), 0.5), rtol=1e-6)
    for call in (lambda: model.run({"X": x}), lambda: model.gradient("Y", ["A"], feeds={"X": x})):
        with pytest.raises(UnsupportedOpError) as exc:
            call()
        _one_line_naming_the_op(str(exc.value))


@pytest.mark.parametrize("argv", [
    ["run", "{m}", "--output", "Z"],
    ["grad", "{m}", "--y", "Z", "--xs", "A"],
    ["grad", "{m}", "--y", "C", "--xs", "B"],
    ["check", "{m}", "--y", "Z", "--xs", "A"],
])
def test_cli_works_where_the_op_is_not_reached(custom_op_path, capsys, argv):
    assert main([a.replace("{m}", custom_op_path) for a in argv]) == 0, capsys.readouterr().err


def test_cli_run_computes_the_outputs_the_op_does_not_block(custom_op_path, tmp_path, capsys):
    assert main(["run", custom_op_path, "--out", str(tmp_path / "o.npz")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "skipped" in line] == [
        f"note: {t} skipped: it needs node 'custom' (com.example::MyCustomOp), an op onnxgrad cannot run "
        "(--ops FILE.py registers it)" for t in ("Y", "C")]
    with np.load(tmp_path / "o.npz") as out:
        assert out.files == ["Z"]
        np.testing.assert_allclose(out["Z"], np.tanh(x_default()) * 0.5, rtol=1e-6)


@pytest.mark.parametrize("argv", [
    ["run", "{m}", "--output", "Y"],
    ["run", "{m}", "--output", "Z", "--output", "C"],
    ["grad", "{m}", "--y", "Y", "--xs", "A"],
    ["check", "{m}", "--y", "Y", "--xs", "A"],
    ["graph", "{m}", "--y", "Y", "--xs", "A", "--stats", "-o", "{tmp}/g.txt"],
])
def test_cli_reaching_the_op_is_one_line_exit_2(custom_op_path, tmp_path, capsys, argv):
    assert main([a.replace("{m}", custom_op_path).replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note: ")]
    assert len(errors) == 1 and errors[0].startswith("onnxgrad: error: node 'custom'")
    _one_line_naming_the_op(errors[0])


def test_ops_file_registers_forward_and_vjp_for_every_command(custom_op_path, ops_file, tmp_path, capsys):
    x = x_default()
    a = np.tanh(x).astype(np.float64)
    assert main(["run", custom_op_path, "--ops", ops_file, "--out", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as out:
        np.testing.assert_allclose(out["Y"], a * a + np.sin(a) + a, rtol=1e-5)
    assert main(["grad", custom_op_path, "--ops", ops_file, "--y", "Y", "--xs", "A", "--out", str(tmp_path / "g.npz")]) == 0
    with np.load(tmp_path / "g.npz") as g:
        np.testing.assert_allclose(g["A"], 2 * a + np.cos(a) + 1, rtol=1e-5)
    assert main(["check", custom_op_path, "--ops", ops_file, "--y", "Y", "--xs", "X"]) == 0
    assert main(["ops", "--ops", ops_file]) == 0
    assert "com.example::MyCustomOp" in capsys.readouterr().out
    # Each command registered the op for itself only: the registry is as it was.
    assert not any(e.domain == "com.example" for e in engine.supported_ops())
    assert main(["run", custom_op_path, "--output", "Y"]) == 2


def test_a_model_loaded_before_the_op_was_registered_sees_it(ops_file):
    from engine.opsfile import load_ops_file

    model = engine.load(custom_op_model())
    assert model.unsupported_nodes()
    assert load_ops_file(ops_file) == ("com.example::MyCustomOp",)
    assert model.unsupported_nodes() == {} and model.unsupported_summary() is None
    assert model.run({"X": x_default()})["Y"].shape == (2, 3)


@pytest.mark.parametrize("content,needle", [
    (None, "no such file"),
    ("import engine\nx = 1 / 0\n", "ZeroDivisionError on line 2: division by zero"),
    ("def f(:\n", "syntax error on line 1"),
    ("x = 1\n", "registered no op"),
])
def test_bad_ops_files_are_one_line_exit_2(custom_op_path, tmp_path, capsys, content, needle):
    ops = tmp_path / "ops.py"
    if content is not None:
        ops.write_text(content)
    for argv in (["run", custom_op_path, "--ops", str(ops)], ["ops", "--ops", str(ops)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"onnxgrad: error: --ops {ops}") and needle in err
        assert len(err.strip().splitlines()) == 1


def test_explore_with_a_bad_ops_file_exits_2(custom_op_path, tmp_path, capsys):
    from explorer.launcher import main as launcher

    assert launcher(["explore", custom_op_path, "--ops", str(tmp_path / "nope.py")]) == 2
    assert capsys.readouterr().err.strip() == f"onnxgrad: error: --ops {tmp_path / 'nope.py'}: no such file"
