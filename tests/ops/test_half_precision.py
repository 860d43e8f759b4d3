"""float16 and bfloat16 models run and differentiate in their own dtype.

Against ONNX: half variants of onnx's float32 node cases (conformance/variants.py: expected values
from onnx.reference on the inputs rounded to the half type) for the ops real models are made of;
the full sweep is `onnxgrad conformance --dtype float16 --gradients` (docs/semantics.md). The
verifier's judgement of a half gradient (verify/native.py) on the cases float16 makes hard: ReLU
decisions flipped by rounding, saturated tanh, a gradient that cancels to zero, and a half-only
bug it must catch. Real exported models: tests/ops/test_half_real_models.py.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.conformance import PASS, case_named, run_case
from engine.conformance.gradients import check_case
from engine.conformance.retype import retyped
from engine.conformance.typecheck import dtype_mismatches
from engine.conformance.variants import make_variant
from engine.conformance.verifier import native_check
from engine.errors import ExecutionError
from engine.verify import check, register_op_with_vjp
from tests import paths

F16, BF16, F32 = TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT
HALF = {"float16": (F16, np.float16), "bfloat16": (BF16, ml_dtypes.bfloat16)}

# What transformers and CNNs are made of, and the ops that compute inside in float32 for half
# inputs (Det, RoiAlign, GridSample, the recurrent ops, Erf, Pow, ReduceProd) or had half-only
# bugs (QuantizeLinear's saturation, Pow with an integer base).
FORWARD_CASES = (
    "test_matmul_3d", "test_gemm_default_vector_bias", "test_conv_with_strides_padding",
    "test_layer_normalization_3d_axis_negative_1_epsilon", "test_softmax_axis_1", "test_gelu_tanh_2", "test_erf",
    "test_tanh", "test_sigmoid", "test_div_bcast", "test_reduce_prod_do_not_keepdims_random",
    "test_pow_bcast_array", "test_sqrt", "test_reduce_mean_keepdims_random", "test_batchnorm_epsilon",
    "test_maxpool_2d_pads", "test_averagepool_2d_strides", "test_globalaveragepool", "test_relu", "test_where_example",
    "test_attention_4d_causal", "test_lstm_defaults", "test_det_nd", "test_roialign_mode_max", "test_gridsample",
    "test_quantizelinear_int16", "test_pow_types_int64_float32", "test_resize_upsample_scales_linear",
    "test_cast_FLOAT_to_DOUBLE", "test_rms_normalization_3d_axis_negative_1_epsilon",
)
GRADIENT_CASES = ("test_layer_normalization_3d_axis_negative_1_epsilon", "test_softmax_axis_1", "test_conv_with_strides_padding",
                  "test_gelu_tanh_2", "test_lstm_defaults", "test_det_nd", "test_roialign_mode_max",
                  "test_attention_4d_causal", "test_maxpool_2d_pads")


@pytest.mark.parametrize("dtype", HALF)
def test_half_variants_of_node_cases_match_the_reference(dtype):
    failures = []
    for name in FORWARD_CASES:
        variant = make_variant(case_named(name), dtype)
        assert not isinstance(variant, str), f"{name}: {variant}"
        outcome = run_case(variant)  # compares element types too
        if outcome.status != PASS:
            failures.append(f"{variant.name}: {outcome.status} {outcome.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", HALF)
def test_half_gradients_of_node_cases_are_within_the_dtypes_precision(dtype):
    failures = []
    for name in GRADIENT_CASES:
        outcome = check_case(make_variant(case_named(name), dtype), native_check)
        if outcome.status not in (PASS, "inconclusive"):
            failures.append(f"{outcome.name}: {outcome.status} {outcome.reason}")
    assert not failures, "\n".join(failures)


def test_variants_keep_what_onnx_types_fix():
    cast = make_variant(case_named("test_cast_FLOAT_to_DOUBLE"), "float16")
    assert cast.model.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    resize = make_variant(case_named("test_resize_upsample_scales_linear"), "float16")
    types = {i.name: i.type.tensor_type.elem_type for i in resize.model.graph.input}
    assert types == {"X": F16, "scales": F32}  # Resize's scales are float in every opset
    assert resize.model.graph.output[0].type.tensor_type.elem_type == F16
    # An op whose schema excludes the type at the case's opset has no variant, and says why.
    assert "no float32 tensor admits" in make_variant(case_named("test_nonmaxsuppression_suppress_by_IOU"), "float16")


def _vi(name: str, elem: int, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset: int = 20) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _unary(op: str, elem: int, shape) -> onnx.ModelProto:
    return _model([helper.make_node(op, ["x"], ["y"])], [_vi("x", elem, shape)], [_vi("y", elem, shape)])


UNARY = {"Exp": np.exp, "Tanh": np.tanh, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Erf": np.vectorize(math.erf),
         "Softplus": lambda v: np.log1p(np.exp(v)), "Neg": np.negative, "Relu": lambda v: np.maximum(v, 0),
         "Sin": np.sin, "Cos": np.cos, "Abs": np.abs}


@settings(max_examples=25, deadline=None)
@given(op=st.sampled_from(sorted(UNARY)), dtype=st.sampled_from(sorted(HALF)),
       values=st.lists(st.floats(-6, 6, width=16), min_size=1, max_size=12))
def test_elementwise_ops_keep_the_half_type_and_round_once(op, dtype, values):
    elem, np_type = HALF[dtype]
    x = np.asarray(values, np.float32).astype(np_type)
    model = engine.load(_unary(op, elem, [len(values)]))
    y = model.run({"x": x})["y"]
    exact = UNARY[op](x.astype(np.float64))
    info = ml_dtypes.finfo(np_type)  # one rounding of the exact value: within half an ulp, or a subnormal step
    np.testing.assert_allclose(y.astype(np.float64), exact, rtol=float(info.eps), atol=float(info.smallest_subnormal))
    grads = model.prepare_gradient("y", ["x"])(torch.from_numpy(x.astype(np.float32)).to(getattr(torch, dtype)))
    assert grads.grads[0].dtype == getattr(torch, dtype) and grads.y.dtype == getattr(torch, dtype)


def test_ops_without_half_kernels_compute_in_float32_and_keep_the_type():
    model = engine.load(_model([helper.make_node("Det", ["x"], ["y"])], [_vi("x", F16, [3, 3])], [_vi("y", F16, [])]))
    x = np.array([[2, 1, 0], [1, 3, 1], [0, 1, 4]], np.float16)
    y = model.run({"x": x})["y"]
    assert y.dtype == np.float16 and float(y) == pytest.approx(np.linalg.det(x.astype(np.float64)), rel=1e-3)
    out = model.prepare_gradient("y", ["x"])(torch.from_numpy(x))
    assert out.grads[0].dtype == torch.float16


def test_quantizing_float16_saturates_at_bounds_float16_cannot_hold():
    # 32767 is not a float16 number (it rounds to 32768, which wrapped to -32768 as int16).
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], [_vi("x", F16, [3])],
                   [_vi("y", TensorProto.INT16, [3])],
                   [helper.make_tensor("s", F16, [], [1.0]), helper.make_tensor("z", TensorProto.INT16, [], [0])], opset=21)
    y = engine.load(model).run({"x": np.array([40000, -40000, 12], np.float16)})["y"]
    assert y.tolist() == [32767, -32768, 12]


def test_an_integer_base_with_a_half_exponent_is_exact():
    ints = TensorProto.INT64
    model = engine.load(_model([helper.make_node("Pow", ["x", "e"], ["y"])], [_vi("x", ints, [2]), _vi("e", BF16, [2])],
                               [_vi("y", ints, [2])], opset=15))
    y = model.run({"x": np.array([3, 2]), "e": np.array([6, 10], ml_dtypes.bfloat16)})["y"]
    assert y.tolist() == [729, 1024]  # 729 is not a bfloat16 number


def test_a_mistyped_model_is_named_as_such():
    # torch.onnx.export of a float16 GPT-2 with SDPA attention casts the attention to float32 and
    # feeds that into a float16 LayerNormalization (onnxruntime refuses the model too).
    proto = _model([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"])], [_vi("x", F32, [2, 4])],
                   [_vi("y", F16, [2, 4])],
                   [helper.make_tensor("scale", F16, [4], [1.0] * 4), helper.make_tensor("bias", F16, [4], [0.0] * 4)], opset=17)
    model = engine.load(proto, check=False)
    with pytest.raises(ExecutionError, match=r"inputs 'x' \(float32\) and 'scale' \(float16\) must have one type .*mistyped"):
        model.run({"x": np.ones((2, 4), np.float32)})


def _half_relu(n: int) -> onnx.ModelProto:
    """y = sum(Relu(a * c - d)) in float16."""
    nodes = [helper.make_node("Mul", ["a", "c"], ["p"]), helper.make_node("Sub", ["p", "d"], ["q"]),
             helper.make_node("Relu", ["q"], ["r"]), helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)]
    return _model(nodes, [_vi(v, F16, [n]) for v in "acd"], [_vi("y", F16, [])])


def test_relu_decisions_flipped_by_rounding_are_within_float16_precision():
    a = np.array([1.1, 1.3, 0.7, 1.9], np.float16)
    c = np.full(4, 3.0, np.float16)
    exact = a.astype(np.float64) * c.astype(np.float64)
    d = exact.astype(np.float16)  # a * c rounds onto d: Relu(0) in float16, a positive or negative sliver in float64
    report = check(_half_relu(4), "y", ["a"], ["c", "d"], feeds={"a": a, "c": c, "d": d}, mode="full")
    (r,) = report.results
    assert r.native_dtype == "float16" and r.native_status == "pass", report.findings
    assert r.native_max_abs_err >= 1.0  # a whole 3.0 of some element's gradient is gone in float16...
    assert r.native_rounding_err >= 1.0  # ...and rounding the values to float16 explains it


def test_saturated_and_cancelling_gradients_are_within_float16_precision():
    # tanh(6) is 1.0 in float16, so its derivative is 0 there; Softmax's bias gradient is zero up to roundoff.
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Softmax", ["u"], ["s"], axis=-1), helper.make_node("Mul", ["s", "t"], ["y"])]
    model = _model(nodes, [_vi("x", F16, [2, 3]), _vi("b", F16, [1])], [_vi("y", F16, [2, 3])])
    feeds = {"x": np.array([[6.0, 5.0, 0.3], [7.0, -5.5, 0.1]], np.float16), "b": np.array([0.25], np.float16)}
    report = check(model, "y", ["x", "b"], feeds=feeds, mode="full")
    assert [r.native_status for r in report.results] == ["pass", "pass"], report.findings
    assert _text(report).count("within float16 precision") == 2


def _text(report) -> str:
    from engine.verify.text import format_report

    return format_report(report)


def test_a_half_only_backward_bug_is_beyond_the_dtypes_precision():
    def vjp(grads, inputs, outputs):
        wrong = 1.05 if grads[0].dtype == torch.float16 else 1.0  # right in float64, 5% off in float16
        return (grads[0] * (1 - outputs[0] ** 2) * wrong,)

    model = _unary("Tanh", F16, [8])
    x = np.linspace(-2, 2, 8).astype(np.float16)
    with register_op_with_vjp("Tanh", torch.tanh, vjp, since=6):
        report = check(model, "y", ["x"], feeds={"x": x}, mode="full")
    (r,) = report.results
    assert r.status == "pass" and r.native_status == "fail"  # float64 finite differences cannot see it
    assert any(f.kind == "native-precision" and "more than the dtype's rounding explains" in f.message
               for f in report.findings)
    assert "BEYOND float16 precision" in _text(report)


def test_type_check_finds_an_op_that_leaves_the_half_type():
    proto = _unary("Tanh", F16, [4])
    model = engine.load(proto)
    feeds = {"x": np.zeros(4, np.float16)}
    assert dtype_mismatches(model, proto, feeds) == []
    with register_op_with_vjp("Tanh", lambda x: torch.tanh(x.float()), lambda g, i, o: (g[0],), since=6):
        found = dtype_mismatches(engine.load(proto), proto, feeds)
    assert [(m.tensor, m.op_type, m.got, m.expected) for m in found] == [("y", "Tanh", "float32", "float16")]


def test_retyped_widens_a_bfloat16_model_exactly():
    proto = _unary("Sigmoid", BF16, [5])
    x = np.array([-3, -0.5, 0, 0.7, 2.5], ml_dtypes.bfloat16)
    wide = retyped(proto, BF16, F32, casts=True)
    assert wide.graph.input[0].type.tensor_type.elem_type == F32
    narrow, widened = engine.load(proto).run({"x": x})["y"], engine.load(wide).run({"x": x.astype(np.float32)})["y"]
    np.testing.assert_allclose(narrow, widened, rtol=2.0**-8)  # one bfloat16 rounding apart


def test_semantics_md_lists_the_ops_that_compute_in_float32():
    import re

    from engine.registry import supported_ops

    text = (paths.ROOT / "docs" / "semantics.md").read_text()
    listed = re.search(r"<!-- half-in-float32 -->(.*?)<!-- /half-in-float32 -->", text, flags=re.S).group(1)
    registered = {i.op_type for i in supported_ops() if getattr(i.fn, "half_in_float32", False)}
    assert {op.strip() for op in listed.replace("\n", " ").split(",")} == registered
