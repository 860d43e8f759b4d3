"""Where a gradient's NaN comes from (issue 20): only gradients flowing toward xs are blamed, and the
finding says which forward value made the VJP non-finite and which node hides it in the forward."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.cli import main
from tests.debug_models import exported_attention, hidden_nan_attention, sqrt_at_zero

MASK = np.array([[1, 1, 1], [0, 0, 0]], np.int64)  # the second sequence masks every key


@pytest.fixture(scope="module")
def attention():
    return engine.load(hidden_nan_attention())


def _x(shape=(2, 3, 4)):
    return np.random.default_rng(2).standard_normal(shape).astype(np.float32)


def test_the_softmax_is_blamed_not_the_pow_exponents(attention):
    result = attention.gradient("Y", ["X"], ["mask"], feeds={"X": _x(), "mask": MASK})
    assert np.isfinite(result.y).all() and np.isnan(result.grads["X"]).any()
    finding = engine.nonfinite_origin(attention, "Y", ["X"], ["mask"], feeds={"X": _x(), "mask": MASK})
    assert (finding.kind, finding.node, finding.tensor) == ("nonfinite-gradient", "softmax", "masked")
    assert (finding.value, finding.hidden_by) == ("probs", "hide_nan")
    assert finding.message.endswith("in the gradient it sends to 'masked': its output 'probs' holds NaN "
                                    "(9 of 18 elements), hidden downstream by node 'hide_nan' (Where)")
    assert "float32" in finding.message


def test_check_reports_the_same_origin_in_float64(attention):
    report = engine.check(attention, "Y", ["X"], ["mask"], feeds={"X": _x(), "mask": MASK}, mode="fast")
    (finding,) = [f for f in report.findings if f.kind == "nonfinite-gradient"]
    assert (finding.node, finding.value, finding.hidden_by) == ("softmax", "probs", "hide_nan")
    assert "float64 backward pass" in finding.message
    assert {f["kind"]: f["hidden_by"] for f in report.to_dict()["findings"]}["nonfinite-gradient"] == "hide_nan"
    # The finding names the node: no automatic per-node search (it cost GPT-2 40 minutes), unless asked.
    assert report.verdict == "fail" and report.nodes == ()
    asked = engine.check(attention, "Y", ["X"], ["mask"], feeds={"X": _x(), "mask": MASK}, mode="fast", per_node=True)
    assert {n.node_name for n in asked.nodes} >= {"softmax", "hide_nan", "cube_out"}


def test_unmasked_attention_has_no_origin_to_report(attention):
    ones = np.ones_like(MASK)
    assert np.isfinite(attention.gradient("Y", ["X"], ["mask"], feeds={"X": _x(), "mask": ones}).grads["X"]).all()
    assert engine.nonfinite_origin(attention, "Y", ["X"], ["mask"], feeds={"X": _x(), "mask": ones}) is None


def test_finite_forward_values_with_an_infinite_derivative_say_so():
    model = engine.load(sqrt_at_zero())
    x = np.array([[1.0, 0.0, -2.0], [4.0, 0.5, 0.0]], np.float32)
    finding = engine.nonfinite_origin(model, "Y", ["X"], feeds={"X": x})
    assert (finding.node, finding.tensor, finding.value) == ("sqrt", "r", None)
    assert finding.message.endswith("its forward values are finite, its derivative is not at them ('r' holds 3 zeros)")


def test_a_forward_nan_is_reported_where_it_first_appears():
    model = engine.load(sqrt_at_zero())
    x = np.array([[1.0, np.nan, 2.0], [4.0, 0.5, 1.0]], np.float32)
    finding = engine.nonfinite_origin(model, "Y", ["X"], feeds={"X": x})
    assert finding.kind == "nonfinite-value" and "already holds NaN/Inf" in finding.message


def test_torch_exported_attention_block_blames_its_softmax():
    """torch's exporter hides the all-masked Softmax's NaN behind IsNaN/Where; the block's GELU
    has x³ as a Pow with a constant exponent downstream, which the old search blamed."""
    model = engine.load(exported_attention())
    graph = model.graph
    assert {"IsNaN", "Pow", "Softmax"} <= {n.op_type for n in graph.nodes}
    weight = "qkv.bias"  # the first layer: every gradient toward it crosses the Softmax
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32),
             "attention_mask": np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], np.int64)}
    finding = engine.nonfinite_origin(model, "y", [weight], ["x", "attention_mask"], feeds=feeds)
    op = {name: graph.nodes[i].op_type for i, name in enumerate(graph.node_names)}
    assert op[finding.node] == "Softmax" and op[finding.hidden_by] == "Where"
    assert graph.producer[finding.value] == graph.node_names.index(finding.node)


def test_cli_grad_notes_the_origin(tmp_path, capsys):
    import onnx

    onnx.save(hidden_nan_attention(), tmp_path / "attention.onnx")
    np.save(tmp_path / "mask.npy", MASK)
    code = main(["grad", str(tmp_path / "attention.onnx"), "--y", "Y", "--xs", "X", "--zs", "mask",
                 "--feed", f"mask={tmp_path / 'mask.npy'}"])
    out, err = capsys.readouterr()
    assert code == 0 and "non-finite" in out
    assert ("note: NaN/Inf first appears in the float32 backward pass in the VJP of node 'softmax' (Softmax)"
            in err.splitlines()[-1])
