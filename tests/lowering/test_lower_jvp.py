"""engine.lowering.jvp (`onnxgrad lower --jvp`): J·v written as plain ai.onnx ops, run by onnxruntime and
compared with the engine's forward mode (`Model.jvp`, torch's forward AD): every forward rule and some
ops that go through their backward rule transposed (tests/lowering/jvp_cases.py), every sample model,
and the errors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import engine
from engine.cli import main as cli_main
from engine.errors import LoweringError
from engine.lowering.build import opset_version
from engine.lowering.jvp import FORWARD, lower_jvp
from tests.lowering.jvp_cases import CASES, build
from tests.lowering_checks import check_valid, ort_run
from tests.run.test_samples import SAMPLES, _path

ort = pytest.importorskip("onnxruntime")
L2_TOL = {np.float64: 1e-6, np.float32: 1e-4, np.float16: 5e-3}  # relative L2 (issue 36's targets)


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def run_jvp(model, y, xs, zs, feeds, tangents, lowered=None):
    """(onnxruntime's J·v on the lowered model, the engine's), tangents fed as t_{x}."""
    lowered = lowered if lowered is not None else lower_jvp(model, y, xs, zs)
    want = engine.load(model).jvp(y, xs, tangents, zs, feeds=feeds)
    got = ort_run(lowered, {**feeds, **{f"t_{x}": v for x, v in want.tangents.items()}})
    return got[f"jvp_{y}"], want.jvp


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_engine(case):
    """Float64 where onnxruntime has the kernels, else float32."""
    for dtype in case.dtypes:
        model, y, xs, feeds, tangents = build(case, dtype)
        lowered = lower_jvp(model, y, xs)
        check_valid(lowered)
        assert opset_version(lowered) == case.opset
        try:
            got, want = run_jvp(model, y, xs, (), feeds, tangents, lowered)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's CPU provider lacks many float64 kernels
            if dtype is not case.dtypes[-1] and "NOT_IMPLEMENTED" in str(exc):
                continue
            raise
        assert np.abs(want).max() > 0, "a zero J·v checks nothing"
        assert rel_l2(got, want) <= L2_TOL[dtype], (np.dtype(dtype).name, rel_l2(got, want))
        return


def test_every_forward_rule_has_a_case():
    assert not set(FORWARD) - {c.op for c in CASES}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_sample_matches_engine(name):
    sample = SAMPLES[name]
    model = engine.load(_path(name))
    feeds = {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)} \
        if "X" in sample.feeds else {}
    inner = [m for m in sample.xs + sample.zs if m in model.graph.producer]  # an intermediate x: the model's value
    feeds.update(model.run(feeds, outputs=inner) if inner else {})
    lowered = lower_jvp(_path(name), sample.y, sample.xs, sample.zs)
    check_valid(lowered)
    assert opset_version(lowered) == max(17, opset_version(onnx.load(_path(name))))
    got, want = run_jvp(_path(name), sample.y, sample.xs, sample.zs, feeds, "random", lowered)
    assert np.abs(want).max() > 0
    tol = L2_TOL[np.float16 if want.dtype == np.float16 else np.float32]
    assert rel_l2(got, want) <= tol


def test_forward_runs_once_with_no_backward_pass():
    """Along X alone (weights carry no tangent), each MatMul adds one tangent MatMul per operand computed
    from X (two for attention's Q Kᵀ and A V), and no op of a backward pass (ScatterElements) appears."""
    path = _path("transformer_block")
    forward = onnx.load(path)
    lowered = lower_jvp(path, "loss", ["X"], [])
    weights = {t.name for t in forward.graph.initializer}
    count = lambda m, op: sum(n.op_type == op for n in m.graph.node)  # noqa: E731
    computed = sum(t not in weights for n in forward.graph.node if n.op_type == "MatMul" for t in n.input)
    assert count(forward, "MatMul") < computed
    assert count(lowered, "MatMul") == count(forward, "MatMul") + computed
    assert count(lowered, "ScatterElements") == 0


def test_y_not_reached_is_zeros_and_names_are_chosen():
    model = onnx.load(_path("mlp"))
    lowered = lower_jvp(model, "logits", ["W2"], ["X", "T"], tangents="dW2", name="Jv")
    assert [i.name for i in lowered.graph.input][-1] == "dW2"
    v = np.ones_like(engine.load(model).constants()["W2"].numpy())
    got = ort_run(lowered, {"dW2": v})["Jv"]
    assert got.shape == engine.load(model).run()["logits"].shape and np.abs(got).max() > 0
    unreached = lower_jvp(model, "logits", ["T"], ["X"])
    assert np.all(ort_run(unreached, {"t_T": np.ones(engine.load(model).constants()["T"].shape,
                                                           np.float32)})["jvp_logits"] == 0)


def test_name_clash_is_one_line():
    with pytest.raises(LoweringError, match="already a tensor"):
        lower_jvp(_path("mlp"), "loss", ["W1"], ["X", "T"], name="logits")


def _unique_model():
    nodes = [helper.make_node("Unique", ["x"], ["u"], sorted=1), helper.make_node("ReduceSum", ["u"], ["y"])]
    graph = helper.make_graph(nodes, "unique", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_op_without_any_rule_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(LoweringError) as info:
        lower_jvp(_unique_model(), "y", ["x"])
    assert "Unique" in str(info.value) and "\n" not in str(info.value)
    path = tmp_path / "unique.onnx"
    onnx.save(_unique_model(), path)
    assert cli_main(["lower", str(path), "--jvp", "--y", "y", "--xs", "x", "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Unique" in err and len(err.splitlines()) == 1


def test_cli_writes_a_jvp_model(tmp_path, capsys):
    out = tmp_path / "jvp.onnx"
    assert cli_main(["lower", _path("small_cnn"), "--jvp", "--y", "logits", "--xs", "X,conv1_W", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "jvp_logits" in printed and "tangent inputs: t_X, t_conv1_W" in printed
    lowered = onnx.load(out)
    check_valid(lowered)
    assert cli_main(["lower", _path("small_cnn"), "--jvp", "--y", "logits", "--xs", "X", "--dy",
                     "-o", str(out)]) == 2


def test_symbolic_batch_and_image_size_lower_once():
    """Batch, height and width symbolic: one lowered JVP runs at two sizes; a tangent on a bias alone
    (B2, added to a symbolic-shaped tensor) is broadcast to the sum's run-time shape."""
    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(s) * 0.5).astype(np.float32)
         for k, s in {"W1": (4, 2, 3, 3), "B1": (4,), "Wf": (4, 5), "B2": (1, 5), "S": (5,)}.items()}
    n = helper.make_node
    nodes = [n("Conv", ["X", "W1", "B1"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("GlobalAveragePool", ["p"], ["g"]), n("Flatten", ["g"], ["f"]), n("MatMul", ["f", "Wf"], ["m"]),
             n("Add", ["m", "B2"], ["a"]), n("LayerNormalization", ["a", "S"], ["l"]),
             n("Softmax", ["l"], ["Y"])]
    graph = helper.make_graph(nodes, "symbolic", [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2, "height", "width"]),
        *[helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in w.items()]],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    for xs in (["X", "W1", "Wf", "S"], ["B2"]):
        zs = [k for k in ["X", *w] if k not in xs]
        lowered = lower_jvp(model, "Y", xs, zs)
        check_valid(lowered)
        for shape in [(2, 2, 8, 8), (3, 2, 6, 10)]:
            feeds = {**w, "X": rng.standard_normal(shape).astype(np.float32)}
            got, want = run_jvp(model, "Y", xs, zs, feeds, "random", lowered)
            assert got.shape == (shape[0], 5) and rel_l2(got, want) <= L2_TOL[np.float32]


def test_jvp_of_a_gradient_node_is_a_hessian_vector_product():
    """The spec's O = sum((X W - L)²): its Gradient node dO/dW is lowered first, then carried forward along
    v on W: forward over reverse, H·v = 2 XᵀX v exactly."""
    path = _path("spec_second_order")
    lowered = lower_jvp(path, "dO_dW", ["W"], ["X", "L"])
    check_valid(lowered)
    x = engine.load(path).constants()["X"].numpy().astype(np.float64)
    v = np.random.default_rng(2).standard_normal((3, 2)).astype(np.float32)
    got = ort_run(lowered, {"t_W": v})["jvp_dO_dW"]
    np.testing.assert_allclose(got, 2 * x.T @ x @ v, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name, exporter", [("mobilenetv3", "torchscript"), ("bert", "dynamo")])
def test_real_model_along_input_and_every_weight(name, exporter):
    """The gradient survey's selection (benchmarks/_real_lowering.py: the float input and every float
    weight), all carrying tangents at once; skipped where timm or transformers do not import."""
    import os
    import sys

    from tests import paths

    sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
    import _real_models as real_models

    if not real_models.available():
        pytest.skip("timm or transformers does not import")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    from _real_lowering import prepared

    case = next(c for c in real_models.LOWERING_CASES if c.name == name)
    proto, model, y, xs, zs, feeds, _ = prepared(case, exporter)
    lowered = lower_jvp(proto, y, xs, zs)
    check_valid(lowered)
    assert len(xs) >= 10
    got, want = run_jvp(proto, y, xs, zs, feeds, "random", lowered)
    assert rel_l2(got, want) <= L2_TOL[np.float32]


def _jvp_matches(model, y, xs, zs, feeds_list):
    lowered = lower_jvp(model, y, xs, zs)
    check_valid(lowered)
    for feeds in feeds_list:
        got, want = run_jvp(model, y, xs, zs, feeds, "random", lowered)
        assert np.abs(want).max() > 0 and rel_l2(got, want) <= L2_TOL[np.float32]


@pytest.mark.parametrize("name", ["test_if_branches_read_the_enclosing_graph",
                                  "test_loop_with_run_time_trip_count_and_outer_weight",
                                  "test_scan_body_reads_an_outer_weight"])
def test_control_flow_through_transposed_backward_rules(monkeypatch, name):
    """If, Loop (a run-time trip count) and Scan have no forward rule: their backward rules, transposed,
    give J·v; the models are tests/lowering/test_control.py's, checked here against Model.jvp."""
    from tests.lowering import test_control

    monkeypatch.setattr(test_control, "_lowered_matches", _jvp_matches)
    getattr(test_control, name)()


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["squeezenet", "inception_v1", "resnet50", "densenet121"])
def test_light_model_along_image_and_three_weights(stem):
    """onnx's light models, with test_light.py's selection (the image and three weights)."""
    from tests.run.test_light_models import _weights, _weights_as_inputs, _with_random_feeds

    proto, model, image, feeds = _with_random_feeds(stem, seed=1)
    cut = _weights_as_inputs(proto, feeds, image)
    xs = [image] + _weights(proto)
    zs = [w for w in feeds if w not in xs]
    lowered = lower_jvp(cut, model.outputs[0], xs, zs)
    got, want = run_jvp(cut, model.outputs[0], xs, zs, feeds, "random", lowered)
    assert rel_l2(got, want) <= L2_TOL[np.float32]


@pytest.mark.parametrize("shape", [(2, 3), (1, 16, 3, 3)])
def test_silu_is_one_product(shape):
    """x·Sigmoid(x) (the exporters' SiLU) carries t·s·(1 + x - y): two Muls for the pair, where the product
    rule and the Sigmoid's rule take four; with 16 channels, 1 - y is a depthwise Conv (jvp/layout.py)."""
    n = helper.make_node
    nodes = [n("Sigmoid", ["x"], ["s"]), n("Mul", ["x", "s"], ["y"])]
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "silu", [info("x", TensorProto.FLOAT, shape)], [info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    lowered = lower_jvp(model, "y", ["x"])
    check_valid(lowered)
    assert sum(node.op_type == "Mul" for node in lowered.graph.node) == 1 + 2
    assert any(node.op_type == "Conv" for node in lowered.graph.node) == (len(shape) == 4)
    x = np.random.default_rng(3).uniform(-8, 8, shape).astype(np.float32)
    got, want = run_jvp(model, "y", ["x"], (), {"x": x}, "random", lowered)
    assert rel_l2(got, want) <= L2_TOL[np.float32]
