"""Ops onnxruntime has no kernel for, written out by the lowering (engine/lowering/portable.py, training.py):
the lowered model runs in onnxruntime, keeps none of them, recomputes the engine's forward and its gradients;
a training-mode Dropout without a mask output gets one, and its gradient is the mask that forward drew."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.conformance.cases import case_named
from engine.conformance.gradients import selection_for
from engine.conformance.lowered import LOWERED, WRONG, _ort_run, lower_case

pytest.importorskip("onnxruntime")

# case -> the (domain, op) onnxruntime cannot run, which the lowered model must not hold
CASES = {
    "test_swiglu": ("", "Swish"),
    "test_swiglu_float16": ("", "Swish"),
    "test_flexattention_gqa": ("ai.onnx.preview", "FlexAttention"),
    "test_flexattention_score_mod": ("ai.onnx.preview", "FlexAttention"),
    "test_dequantizelinear_blocked": ("", "DequantizeLinear"),
    "test_dequantizelinear_axis": ("", "DequantizeLinear"),
    "test_optional_get_element_tensor": ("", "OptionalGetElement"),
    "test_pow_types_float32_uint32": ("", "Pow"),
    "test_gru_batchwise": ("", "GRU"),
    "test_lstm_batchwise": ("", "LSTM"),
    "test_adam_multiple": ("ai.onnx.preview.training", "Adam"),
    "test_nesterov_momentum": ("ai.onnx.preview.training", "Momentum"),
    "test_adagrad": ("ai.onnx.preview.training", "Adagrad"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_runs_in_onnxruntime_and_matches_the_engine(name):
    import onnxruntime  # noqa: F401 - the unlowered case is what onnxruntime refuses

    case = case_named(name)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own refusal, whichever class it raises
        _ort_run(case.model, selection_for(case)[3])
    outcome = lower_case(case)
    assert outcome.status == LOWERED, outcome.reason
    xs, zs, ys, _, _ = selection_for(case)
    lowered = engine.lower(case.model, ys[0], xs, zs)
    domain, op = CASES[name]
    left = [n for n in lowered.graph.node if n.op_type == op and n.domain == domain]
    if op == "Pow":  # kept, reading the uint32 exponent cast to int64
        exponent = case.model.graph.node[0].input[1]
        assert left and all(n.input[1] != exponent for n in left)
    elif op in ("GRU", "LSTM"):  # kept, in layout 0
        assert left and not any(a.name == "layout" and a.i == 1 for n in left for a in n.attribute)
    else:
        assert not left


def test_a_wrong_forward_expansion_is_caught(monkeypatch):
    """Swish written out with an offset: its gradient is right, its forward is not; the sweep says wrong."""
    from engine.lowering import portable

    def offset_swish(ctx, node):
        x = node.input[0]
        y = ctx.op("Mul", [x, ctx.op("Sigmoid", [x])])
        ctx.emit("Add", [y, ctx.scalar(1.0, x)], [node.output[0]])

    case = case_named("test_swiglu")
    monkeypatch.setitem(portable.NEWER, "Swish", (24, offset_swish))
    outcome = lower_case(case)
    assert outcome.status == WRONG and "lowered model's" in outcome.reason, outcome.reason


@pytest.mark.parametrize("name", ["test_training_dropout", "test_training_dropout_default"])
def test_training_dropout_gradient_is_the_mask_it_drew(name):
    case = case_named(name)
    xs, zs, ys, feeds, _ = selection_for(case)
    assert xs == ["x"]
    lowered = engine.lower(case.model, ys[0], xs, zs, dy="dy", names=["dx"])
    dy = np.random.default_rng(0).standard_normal(feeds["x"].shape).astype(np.float32)
    got = _ort_run(lowered, {**feeds, "dy": dy})
    ratio = float(feeds["r"]) if "r" in feeds else 0.5
    kept = got[ys[0]] != 0  # x has no zero: the output is 0 exactly where the mask drops it
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(got["dx"], np.where(kept, dy / (1 - ratio), 0.0), rtol=1e-6)
    np.testing.assert_allclose(got[ys[0]][kept], feeds["x"][kept] / (1 - ratio), rtol=1e-6)
