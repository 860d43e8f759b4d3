"""`--zs inputs` (every graph input not in xs) means the same in every command that takes zs, and in
the Python API: the expansion lives in the engine's selection rules, not in one command."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.cli import main


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """y = sum(tanh(a * b + w)): a in xs, b only reachable through `inputs`."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "w"], ["s"]),
         helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("ReduceSum", ["t"], ["y"], keepdims=0)],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [w])
    path = tmp_path_factory.mktemp("zs") / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_api_expands_inputs_to_the_graph_inputs_outside_xs(two_inputs):
    spec = engine.load(str(two_inputs)).selection("y", "a", "inputs")
    assert spec.zs == ("b",)
    assert engine.load(str(two_inputs)).selection("y", "a,w", "inputs").zs == ("b",)


@pytest.mark.parametrize("command", [
    ["grad"], ["check", "--mode", "fast"], ["graph", "--view", "backward"],
])
def test_every_command_accepts_zs_inputs(two_inputs, tmp_path, command, capsys):
    out = ["-o", str(tmp_path / "g.dot")] if command[0] == "graph" else []
    code = main([command[0], str(two_inputs), *command[1:], "--y", "y", "--xs", "a", "--zs", "inputs", *out])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "not a tensor" not in err


def test_lower_accepts_zs_inputs_and_its_gradient_matches_the_engine(two_inputs, tmp_path):
    out = tmp_path / "lowered.onnx"
    assert main(["lower", str(two_inputs), "--y", "y", "--xs", "a", "--zs", "inputs", "-o", str(out)]) == 0
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in ("a", "b")}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    want = engine.load(str(two_inputs)).gradient("y", ["a"], ["b"], feeds).grads["a"]
    np.testing.assert_allclose(got["dy_da"], want, rtol=1e-5, atol=1e-6)
    # and independently: d/da sum(tanh(a*b + w)) = b * (1 - tanh²)
    w = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    np.testing.assert_allclose(got["dy_da"], feeds["b"] * (1 - np.tanh(feeds["a"] * feeds["b"] + w) ** 2),
                               rtol=1e-5, atol=1e-6)


def test_the_inputs_y_still_needs_are_named_in_one_grammatical_line(two_inputs):
    from engine.errors import SelectionError

    model = engine.load(str(two_inputs))
    with pytest.raises(SelectionError, match=r"depends on 'b', which is in neither \(add it to zs"):
        model.selection("y", "a")
    with pytest.raises(SelectionError, match=r"depends on 'a' and 'b', which are in neither \(add them to zs"):
        model.selection("y", "w")
    assert model.selection("y", "w", "inputs").zs == ("a", "b")
