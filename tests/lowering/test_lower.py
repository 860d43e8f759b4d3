"""engine.lower: Gradient nodes and selections rewritten as plain ai.onnx ops, run by onnxruntime and
compared with the engine's own gradients (torch autograd), for every sample model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.cli import main as cli_main
from engine.errors import LoweringError
from engine.lowering import lower
from tests.lowering_checks import assert_close, check_valid, ort_run
from tests.run.test_samples import SAMPLES, _path

pytest.importorskip("onnxruntime")
X_FEED = {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)}


def _feeds(sample):
    return dict(X_FEED) if "X" in sample.feeds else {}


def _has_gradient_nodes(path):
    return any(n.op_type == "Gradient" for n in onnx.load(path).graph.node)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_sample_selection_matches_engine(name):
    sample = SAMPLES[name]
    names = [f"selected_d{x}" for x in sample.xs]  # d{y}_d{x} may be taken by the sample's Gradient node
    lowered = lower(_path(name), sample.y, sample.xs, sample.zs, names=names)
    check_valid(lowered)
    feeds = _feeds(sample)
    model = engine.load(_path(name))
    # an intermediate member takes the value the model computes (the engine would draw one at random)
    inner = [m for m in sample.xs + sample.zs if m in model.graph.producer]
    values = model.run(feeds, outputs=inner) if inner else {}
    want = model.gradient(sample.y, sample.xs, sample.zs, feeds={**feeds, **values}).grads
    got = ort_run(lowered, feeds)
    assert_close(got, {f"selected_d{x}": g for x, g in want.items()})


@pytest.mark.parametrize("name", [n for n in SAMPLES if _has_gradient_nodes(_path(n))])
def test_gradient_nodes_are_replaced(name):
    lowered = lower(_path(name))
    check_valid(lowered)
    feeds = _feeds(SAMPLES[name])
    want = engine.load(_path(name)).run(feeds)
    assert set(want) == {o.name for o in lowered.graph.output}
    assert_close(ort_run(lowered, feeds), want)


def test_nested_second_order_is_the_closed_form():
    """The spec's nested example: O = sum((X W - L)^2), d2O/dW2 applied to ones is 2 Xᵀ X ones."""
    model = engine.load(_path("spec_second_order"))
    got = ort_run(lower(_path("spec_second_order")), {})
    x = model.constants()["X"].numpy().astype(np.float64)
    np.testing.assert_allclose(got["d2O_dW2"], 2 * x.T @ x @ np.ones((3, 2)), rtol=1e-5)
    w, label = model.constants()["W"].numpy(), model.constants()["L"].numpy()
    np.testing.assert_allclose(got["dO_dW"], 2 * x.T @ (x @ w - label), rtol=1e-5, atol=1e-5)


def test_selection_of_a_lowered_gradient_is_a_second_derivative():
    lowered = lower(_path("mlp"), "loss", "W2", "X,T", names="g")
    twice = lower(lowered, "g", "W2", "X,T,W1,b1,b2", names="h")
    check_valid(twice)
    # loss is linear in log-softmax of (relu(.) W2 + b2); its Hessian-vector product with ones is nonzero
    want = engine.load(lowered).gradient("g", ["W2"], ["X", "T", "W1", "b1", "b2"]).grads["W2"]
    assert_close(ort_run(twice, {}), {"h": want})


def test_dy_seed_is_a_new_input():
    sample = SAMPLES["small_cnn"]
    lowered = lower(_path("small_cnn"), sample.y, sample.xs, dy=True)
    check_valid(lowered)
    m = engine.load(_path("small_cnn"))
    dy = np.random.default_rng(3).standard_normal(m.run()["logits"].shape).astype(np.float32)
    want = m.gradient(sample.y, sample.xs, dy=dy).grads
    assert_close(ort_run(lowered, {"dlogits": dy}), {f"dlogits_d{x}": g for x, g in want.items()})


def _tiny(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_disconnected_xs_get_zeros_and_intermediates_can_be_cut():
    model = _tiny([helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                  [("a", [2, 3]), ("b", [3]), ("c", [4])], [("y", [2, 3])])
    lowered = lower(model, "y", "m,c")
    check_valid(lowered)
    feeds = {k: np.random.default_rng(i).standard_normal(s).astype(np.float32)
             for i, (k, s) in enumerate([("a", (2, 3)), ("b", (3,)), ("c", (4,))])}
    got = ort_run(lowered, feeds)
    m = np.tanh(feeds["a"] * feeds["b"])
    np.testing.assert_allclose(got["dy_dm"], 1 - m ** 2, rtol=1e-5)
    assert "dy_da" not in got
    np.testing.assert_array_equal(got["dy_dc"], np.zeros(4, np.float32))


def test_node_without_rule_fails_with_one_line():
    """A custom op (no rule, no ONNX function body) and an explicit refusal: one line each, naming the node."""

    from engine.verify import register_op_with_vjp

    model = _tiny([helper.make_node("Twice", ["a"], ["y"], name="twice", domain="com.test")], [("a", [3])], [("y", [3])])
    model.opset_import.append(helper.make_opsetid("com.test", 1))
    handle = register_op_with_vjp("Twice", lambda x: 2 * x, lambda g, i, o: (2 * g[0],), domain="com.test")
    try:
        with pytest.raises(LoweringError) as info:
            lower(model, "y", "a")
    finally:
        handle.unregister()
    message = str(info.value)
    assert "'twice' (Twice)" in message and "no backward rule" in message and "\n" not in message
    dft = _tiny([helper.make_node("DFT", ["a"], ["y"], name="spectrum")], [("a", [1, 4, 1])], [("y", [1, 4, 2])])
    with pytest.raises(LoweringError, match=r"^cannot lower node 'spectrum' \(DFT\): the adjoint of a DFT") as info:
        lower(dft, "y", "a")
    assert "\n" not in str(info.value)


def test_cli_writes_a_model_onnxruntime_runs(tmp_path, capsys):
    out = tmp_path / "mlp_grad.onnx"
    assert cli_main(["lower", _path("mlp"), "-o", str(out), "--y", "loss", "--xs", "W1,b1", "--zs", "X,T",
                     "--names", "gW1,gb1"]) == 0
    assert "outputs: loss, logits, gW1, gb1" in capsys.readouterr().out
    got = ort_run(onnx.load(str(out)), {})
    want = engine.load(_path("mlp")).gradient("loss", ["W1", "b1"], ["X", "T"]).grads
    assert_close(got, {"gW1": want["W1"], "gb1": want["b1"]})


@pytest.mark.parametrize("args, message", [
    (["--y", "loss", "--xs", "W9"], "xs member 'W9' is not a tensor of this model"),
    (["--xs", "W1"], "--y and --xs go together"),
    (["--y", "loss", "--xs", "W1", "--names", "logits"], "output name 'logits' is already a tensor"),
    ([], "the model has no Gradient node: name a selection"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    assert cli_main(["lower", _path("mlp"), "-o", str(tmp_path / "o.onnx"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_embedding_gather_adds_repeated_rows_and_reduce_max_splits_ties():
    table = np.arange(20, dtype=np.float32).reshape(5, 4) % 3  # rows with tied maxima
    ids = np.array([[1, 3, 1], [-1, 0, 1]], dtype=np.int64)  # row 1 three times, row 4 as -1
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("ReduceMax", ["e"], ["m"], axes=[-1], keepdims=0),
             helper.make_node("Mul", ["m", "m"], ["y"])]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("table", TensorProto.FLOAT, [5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(ids, "ids")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lowered = lower(model, "y", "table")
    check_valid(lowered)
    got = ort_run(lowered, {"table": table})["dy_dtable"]
    want = engine.load(model).gradient("y", ["table"], feeds={"table": table}).grads["table"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[1].sum() == pytest.approx(3 * 2 * table[1].max())  # three lookups of row 1, ties share
