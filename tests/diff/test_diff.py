"""engine.diff on pairs with one node changed: it names exactly that node, forward or gradient; and
nothing diverges where only the dtype's rounding or the runtime differs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import engine
from tests.diff.models import HALVES, OVERFLOW_X, X, chain, fake_quant, overflow
from tests.verify_models import SAMPLES

FEEDS = {"x": X}


def _first(report):
    first = report.first_divergence
    return None if first is None else (first.node, first.where)


def test_initializer_scaled_names_its_consumer():
    report = engine.diff(chain(), chain(w2_scale=1.01), y="y", xs="W1", zs="x", feeds=FEEDS)
    assert _first(report) == ("mm2", "forward")
    assert "initializer 'W2' differs" in report.first_divergence.note
    assert [c.node for c in report.culprits if c.where == "forward"] == ["mm2"]
    # downstream nodes are off too, but by what arrived, not by themselves
    total = next(n for n in report.nodes if n.node == "total" and n.where == "forward")
    assert total.error > total.tolerance and not total.diverges
    assert report.exit_code == 1


def test_attribute_changed_diverges_transposed_weight_does_not():
    same = engine.diff(chain(), chain(gemm_trans_b=True), y="y", xs="W1", zs="x", feeds=FEEDS)
    assert same.first_divergence is None and same.exit_code == 0
    assert max(n.local_error for n in same.nodes) < 1e-6
    changed = engine.diff(chain(alpha=0.1), chain(alpha=0.2), y="y", xs="W1", zs="x", feeds=FEEDS)
    assert _first(changed) == ("act", "forward")
    assert {c.node for c in changed.culprits} == {"act"}


def test_near_twin_op_relu_vs_leaky_relu():
    report = engine.diff(chain(act="Relu"), chain(alpha=0.01), feeds=FEEDS)
    assert _first(report) == ("act", "forward")
    row = next(n for n in report.nodes if n.node == "act")
    # oracle: numpy's two activations on the same pre-activation
    h = X @ chain.__globals__["W1"]
    expected = np.abs(np.maximum(h, 0) - np.where(h > 0, h, 0.01 * h)).max() / np.abs(np.maximum(h, 0)).max()
    assert row.local_error == pytest.approx(expected, rel=1e-5)
    assert row.input_errors == (("h", 0.0),)


def test_gradient_diverges_where_forward_agrees():
    report = engine.diff(fake_quant(False), fake_quant(True), y="y", xs="x", feeds={"x": HALVES})
    forward = [n for n in report.nodes if n.where == "forward"]
    assert forward and not any(n.diverges for n in forward)
    assert max(n.error for n in forward) == 0.0
    assert _first(report) == ("scale", "gradient")
    row = next(n for n in report.nodes if n.node == "scale" and n.where == "gradient")
    assert row.b_nodes == ("scale_raw", "double", "round", "scale")  # B's four nodes replayed as one
    # torch's autograd: round(2xW)/2 sends nothing back to x, x*W sends W
    x = torch.tensor(HALVES, requires_grad=True)
    (torch.round(2 * x * torch.tensor([0.5, 1.0, 1.5, 2.0])) / 2).sum().backward()
    assert not x.grad.any() and row.local_error == 1.0


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "transformer_block", "residual_fanout"])
def test_float16_cast_of_well_scaled_samples_does_not_diverge(name):
    report = engine.diff(f"{SAMPLES}/{name}.onnx", dtype="float16")
    assert report.first_divergence is None, report.worst()[:3]
    assert len(report.nodes) > 3
    assert 0 < max(n.local_error for n in report.nodes) < 1e-2  # float16 noise, seen and tolerated


def test_float16_gradient_of_mlp_does_not_diverge():
    report = engine.diff(f"{SAMPLES}/mlp.onnx", dtype="float16", y="loss", xs="W1", zs="X,T")
    grads = [n for n in report.nodes if n.where == "gradient"]
    assert len(grads) >= 5 and not report.diverges


def test_float16_overflow_named_where_it_begins():
    report = engine.diff(overflow(), dtype="float16", feeds={"x": OVERFLOW_X})
    assert [c.node for c in report.culprits] == ["grow"]
    assert "float16 overflow begins here" in report.first_divergence.note
    assert report.first_divergence.error == float("inf")
    square = next(n for n in report.nodes if n.node == "square")
    assert not square.diverges and 40000 * 0.999 < float((OVERFLOW_X * 100).max() ** 2) < 65504


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "transformer_block", "residual_fanout"])
def test_engine_against_onnxruntime_on_samples(name):
    report = engine.diff(f"{SAMPLES}/{name}.onnx", against="onnxruntime")
    assert report.first_divergence is None, report.worst()[:3]
    assert len(report.nodes) > 3 and all(n.tolerance < 1e-4 for n in report.nodes)


def test_engine_against_onnxruntime_sees_a_changed_file():
    """The oracle side is onnxruntime: the engine's values come from A, so a B-only change cannot be
    made here; instead compare bytes of one model with a different one by mistake: a model pair."""
    a = onnx.load(f"{SAMPLES}/mlp.onnx")
    report = engine.diff(a.SerializeToString(), against="onnxruntime")
    assert report.first_divergence is None and report.b == "onnxruntime"


def test_bad_forms_are_one_line_errors():
    from engine.errors import DiffError, SelectionError

    with pytest.raises(DiffError, match="compares one model with itself"):
        engine.diff(chain(), chain(), dtype="float16")
    with pytest.raises(DiffError, match="needs a second model"):
        engine.diff(chain())
    with pytest.raises(SelectionError, match="'nope' is not a tensor of A"):
        engine.diff(chain(), chain(), y="nope", xs="W1")


def _renamed_reordered(scale_wv: float) -> onnx.ModelProto:
    """The transformer block with every tensor and node renamed and the k/v projections swapped."""
    from onnx import compose, numpy_helper

    model = onnx.load(f"{SAMPLES}/transformer_block.onnx")
    for w in model.graph.initializer:
        if w.name == "Wv":
            w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(scale_wv), "Wv"))
    nodes = list(model.graph.node)
    k, v = [i for i, n in enumerate(nodes) if n.name in ("k_proj", "v_proj")]
    nodes[k], nodes[v] = nodes[v], nodes[k]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return compose.add_prefix(model, "other/", rename_inputs=False, rename_outputs=False)


def test_renamed_and_reordered_copy_is_matched():
    a = f"{SAMPLES}/transformer_block.onnx"
    same = engine.diff(a, _renamed_reordered(1.0), y="loss", xs="Wq", zs="X")
    assert same.first_divergence is None and not same.unmatched
    assert len([n for n in same.nodes if n.where == "forward"]) >= 25
    changed = engine.diff(a, _renamed_reordered(1.01), y="loss", xs="Wq", zs="X")
    assert _first(changed) == ("v_proj", "forward")
    assert changed.first_divergence.note == "initializer 'Wv' differs (error 0.0099)"
    assert [n for n in changed.nodes if n.node == "v_proj"][0].b_nodes == ("other/v_proj",)


def test_float16_mask_saturating_to_minus_inf_is_not_an_overflow():
    from tests.diff.models import masked_softmax

    x = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    report = engine.diff(masked_softmax(), dtype="float16", feeds={"x": x})
    assert report.first_divergence is None, report.worst()[:2]
    row = next(n for n in report.nodes if n.node == "apply_mask")
    assert row.local_error < 1e-3 and "overflow" not in row.note
    p = np.exp(x - x.max()) * np.array([1, 1, 0, 1])  # numpy's masked softmax: the oracle B must match
    y = float(((p / p.sum()) ** 2).sum())
    assert engine.load(masked_softmax()).run({"x": x}, dtype="float16")["y"] == pytest.approx(y, rel=2e-3)


def test_sigmoid_tail_against_onnxruntime_is_judged_on_its_range(tmp_path):
    """onnxruntime's fast Sigmoid is exact to ~1e-7 absolute: in the tail (inputs near -11, as a YOLO
    head's class scores are) that is 1e-3 of the values, but 1e-7 of the Sigmoid's range."""
    from onnx import helper

    from tests.verify_models import make, vi

    path = tmp_path / "tail.onnx"
    onnx.save(make([helper.make_node("Sigmoid", ["x"], ["y"], "sig")], [vi("x", [64])], [vi("y", [64])]), path)
    x = np.linspace(-11.7, -8.7, 64).astype(np.float32)
    report = engine.diff(str(path), against="onnxruntime", feeds={"x": x})
    row = report.nodes[0]
    assert not report.diverges and row.local_error < 1e-6
    import onnxruntime as ort

    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y64 = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert row.local_error == pytest.approx(np.abs(got - y64).max(), rel=0.5, abs=1e-9)


def test_cast_model_with_inserted_casts():
    from tests.diff.models import cast_pair

    a, b = cast_pair()
    report = engine.diff(a, b, y="y", xs="x", feeds=FEEDS)
    assert report.first_divergence is None, report.worst()[:2]
    act = next(n for n in report.nodes if n.node == "act" and n.where == "forward")
    assert act.b_nodes == ("act", "cast_out") and act.tolerance > 1e-3  # judged at float16's precision
    a, b = cast_pair(1.1)  # float16's tolerance is wider: a 1% change is ten of its epsilons, 10% is a hundred
    assert _first(engine.diff(a, b, y="y", xs="x", feeds=FEEDS)) == ("mm", "forward")



def test_kept_values_are_both_sides_of_every_compared_tensor():
    """keep_values: A's value against B's as the explorer's inspector shows them; the float16 side stays float16."""
    model = engine.load(f"{SAMPLES}/mlp.onnx")
    rng = np.random.default_rng(3)
    feeds = {"X": rng.standard_normal((4, 8)).astype(np.float32), "T": np.eye(4, 3, dtype=np.float32)[[0, 1, 2, 0]]}
    report = engine.diff(model, dtype="float16", y="loss", xs=["W1"], zs=["X", "T"], feeds=feeds, keep_values=True)
    compared = {t for n in report.nodes if n.where == "forward" for t in n.outputs}
    assert compared <= set(report.values.forward)
    a, b = report.values.forward["logits"]
    assert a.dtype == np.float32 and b.dtype == np.float16
    np.testing.assert_allclose(a, model.run_all(feeds)["logits"], rtol=1e-6)
    np.testing.assert_allclose(b, model.run_all(feeds, dtype="float16")["logits"], rtol=1e-3)
    assert 0 < np.abs(a - b).max() < 1e-2 * np.abs(a).max()
    ga, gb = report.values.gradient["logits"]
    assert ga.shape == a.shape and gb.dtype == np.float16 and np.abs(ga).max() > 0
    assert engine.diff(model, dtype="float16", feeds=feeds).values is None
