"""Attention lowered with rows whose every key is masked: onnxruntime's gradients equal the engine's (0 on
such rows, where the function body differentiated as written gives NaN) and float64 finite differences."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.conformance.cases import case_named
from engine.conformance.gradients import selection_for
from engine.conformance.lowered import LOWERED, _ort_run, lower_case, scaled_error

pytest.importorskip("onnxruntime")

FULLY_MASKED = [
    "test_attention_23_boolmask_fullymasked_row_nan_robustness",
    "test_attention_23_fullymasked_qk_matmul_output_mode3_zero",
    "test_attention_24_fullymasked_qk_matmul_output_mode3_zero",
    "test_attention_24_qk_matmul_output_mode3_softmax_precision",  # float16, softmax in float32
    "test_attention_4d_causal_nonpad_negative_offset_structural_empty",
    "test_attention_causal_boolmask_nan_robustness",
    "test_attention_local_window_gqa_rank4_mask",
]


@pytest.mark.parametrize("name", FULLY_MASKED)
def test_fully_masked_rows_lower_and_match_the_engine(name):
    outcome = lower_case(case_named(name))
    assert outcome.status == LOWERED, outcome.reason


def _lowered_gradients(model, feeds: dict, xs: list[str], dy: np.ndarray, zs=()) -> dict[str, np.ndarray]:
    lowered = engine.lower(model, "Y", xs, list(zs), dy="dY", names=[f"dY_d{x}" for x in xs])
    got = _ort_run(lowered, {**feeds, "dY": dy})
    return {x: got[f"dY_d{x}"] for x in xs}


def _finite_differences(model, feeds: dict, xs: list[str], dy: np.ndarray, h: float = 1e-6) -> dict[str, np.ndarray]:
    """d<dy, Y>/dx by central differences of the engine's float64 forward."""
    runner = engine.load(model)
    wide = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}

    def loss(values):
        return float((runner.run(values, outputs=["Y"], dtype="float64")["Y"] * dy).sum())

    out = {}
    for x in xs:
        grad = np.zeros(wide[x].shape)
        for i in np.ndindex(wide[x].shape):
            for sign in (1, -1):
                moved = wide[x].copy()
                moved[i] += sign * h
                grad[i] += sign * loss({**wide, x: moved}) / (2 * h)
        out[x] = grad
    return out


@pytest.mark.parametrize("name, empty_rows", [
    ("test_attention_23_boolmask_fullymasked_row_nan_robustness", (slice(None), slice(None), 0)),
    ("test_attention_4d_causal_nonpad_negative_offset_structural_empty", None),
])
def test_fully_masked_rows_against_float64_finite_differences(name, empty_rows):
    case = case_named(name)
    xs, zs, _, feeds, _ = selection_for(case)
    dy = np.random.default_rng(0).standard_normal(case_info_shape(case)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _lowered_gradients(case.model, feeds, xs, dy, zs)
        want = _finite_differences(case.model, feeds, xs, dy)
    for x in xs:
        assert np.isfinite(got[x]).all()
        assert np.abs(got[x] - want[x]).max() <= 1e-4 * max(1.0, np.abs(want[x]).max()), x
    assert np.abs(got["Q"]).max() > 0  # some row is not masked: the check compares real numbers
    if empty_rows is not None:
        assert (got["Q"][empty_rows] == 0).all()


def case_info_shape(case) -> tuple[int, ...]:
    dims = next(o for o in case.model.graph.output if o.name == "Y").type.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims)


def _attention_model(q_heads, kv_heads, length, keys, head, *, mask, causal, softcap, scale):
    inputs = [helper.make_tensor_value_info("Q", TensorProto.FLOAT, [1, q_heads, length, head]),
              helper.make_tensor_value_info("K", TensorProto.FLOAT, [1, kv_heads, keys, head]),
              helper.make_tensor_value_info("V", TensorProto.FLOAT, [1, kv_heads, keys, head])]
    names = ["Q", "K", "V"]
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("attn_mask", mask, [length, keys]))
        names.append("attn_mask")
    attrs = {"is_causal": int(causal)}
    if softcap:
        attrs["softcap"] = softcap
    if scale:
        attrs["scale"] = scale
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "attention", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, q_heads, length, head])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_random_attention_with_masked_rows(data):
    """GQA or not, bool or additive float masks with fully masked rows, causal, softcap and scale: onnxruntime
    on the lowered model equals the engine, and no gradient is NaN."""
    kv_heads = data.draw(st.sampled_from([1, 2]))
    q_heads = kv_heads * data.draw(st.sampled_from([1, 2]))
    length, keys, head = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)), data.draw(st.sampled_from([2, 4]))
    mask_type = data.draw(st.sampled_from([None, TensorProto.BOOL, TensorProto.FLOAT]))
    causal = data.draw(st.booleans())
    softcap = data.draw(st.sampled_from([0.0, 2.0]))
    scale = data.draw(st.sampled_from([0.0, 0.5]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    feeds = {"Q": rng.standard_normal((1, q_heads, length, head)).astype(np.float32),
             "K": rng.standard_normal((1, kv_heads, keys, head)).astype(np.float32),
             "V": rng.standard_normal((1, kv_heads, keys, head)).astype(np.float32)}
    if mask_type is not None:
        keep = rng.random((length, keys)) < 0.6
        keep[data.draw(st.integers(0, length - 1))] = False  # one row sees no key at all
        feeds["attn_mask"] = keep if mask_type == TensorProto.BOOL else np.where(keep, 0.0, -np.inf).astype(np.float32)
    model = _attention_model(q_heads, kv_heads, length, keys, head, mask=mask_type, causal=causal, softcap=softcap,
                             scale=scale)
    dy = rng.standard_normal((1, q_heads, length, head)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zs = ["attn_mask"] if mask_type is not None else []
        want = engine.load(model).gradient("Y", ["Q", "K", "V"], zs, feeds=feeds, dy=dy).grads
        got = _lowered_gradients(model, feeds, ["Q", "K", "V"], dy, zs)
    for x in ("Q", "K", "V"):
        assert np.isfinite(got[x]).all(), x
        assert scaled_error(got[x], want[x]) <= 1e-5, x
