"""Mutants of onnx's node test cases and the contrib cases that the full attribute fuzz
(benchmarks/fuzz_attributes.py) found refused in one line without naming the mutated attribute (issue 35):
each refusal now names the attribute and its value, and says what it may be or why it is refused.

A mutant differs from a case that runs in one attribute only, so that attribute is what the line must name.
They run under the fuzz's address-space cap: a refusal that regressed to an allocation fails there.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests import attribute_fuzz

BIG, LOW, TOP = 2**31, -2**31, 2**31 - 1


@pytest.fixture(scope="module")
def cases() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in attribute_fuzz.node_test_cases()}


def _contrib(name: str) -> attribute_fuzz.Case:
    from engine.conformance.contrib import case_model, expected
    from engine.conformance.contrib_cases import all_cases

    c = next(c for c in all_cases() if c.name == name)
    return attribute_fuzz.Case(c.name, case_model(c, "float32", expected(c, "float32")), c.feeds())


def _line(case: attribute_fuzz.Case, attribute: str, value: int, index: int | None = None) -> str:
    """The one line the mutant is refused with; fails unless the unmutated case runs and the line names
    the attribute and its value."""
    with attribute_fuzz.address_space_cap(4), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert attribute_fuzz.runs(case), case.name
        outcome, line = attribute_fuzz.exercise(attribute_fuzz.Mutant(case, attribute, index, value))
    assert outcome == "named" and "\n" not in line, (outcome, line)
    assert attribute in line and str(value) in line, line
    return line


@pytest.mark.parametrize("name, value, label", [
    ("test_sce_NCd1d2d3_sum_weight_high_ii", 0, "label 10 at [0] is outside [0, 5) and is not ignore_index = 0"),
    ("test_sce_NCd1_mean_weight_negative_ii", TOP, "label -1 at [0, 0] is outside [0, 5)"),
    ("test_nllloss_NCd1d2d3_none_no_weight_negative_ii", BIG, "is outside [0, 5) and is not ignore_index = 2147483648"),
])
def test_a_label_outside_the_classes_names_ignore_index(cases, name, value, label):
    assert label in _line(cases[name], "ignore_index", value)


def test_any_nonzero_dft_inverse_is_the_inverse_transform(cases):
    """inverse is a flag (onnxruntime takes any nonzero int): 3 and -2³¹ run and equal inverse = 1."""
    import engine

    case = cases["test_dft"]
    outs = []
    for value in (1, 3, LOW):
        data = attribute_fuzz.Mutant(case, "inverse", None, value).model_bytes()
        outs.append(next(iter(engine.load(data).run(case.feeds).values())))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_a_dft_of_length_zero_names_its_axis(cases):
    assert "along axis 0 (of size 1) has length 0" in _line(cases["test_dft_irfft_opset19"], "axis", 0)


# (case, attribute, element of a list or None, value, what the line says)
NODE_MUTANTS = [
    ("test_quantizelinear", "precision", None, BIG, "'precision' is 2147483648, expected 0 (y_scale's type)"),
    ("test_quantizelinear_axis", "block_size", None, 3, "by block_size 3"),
    ("test_quantizelinear_blocked_asymmetric", "block_size", None, 1, "takes a scale of shape [3, 4]"),
    ("test_quantizelinear_blocked_symmetric", "output_dtype", None, 1, "output_dtype = 1 (FLOAT) is not supported"),
    ("test_quantizelinear_blocked_asymmetric", "axis", None, 0, "along axis 0 by block_size 2"),
    ("test_dequantizelinear_blocked", "block_size", None, 1, "by block_size 1 (that takes a scale of shape [1, 4, 3, 2])"),
    ("test_dequantizelinear_blocked", "block_size", None, 0, "block_size is 0"),
    ("test_bitcast_float32_to_int32", "to", None, 2, "to = 2 (uint8) has 8, the input (float32) 32"),
    ("test_attention_3d_local_window", "kv_num_heads", None, 4, "'kv_num_heads' is 4"),
    ("test_attention_3d_local_window", "q_num_heads", None, 2, "q_num_heads 2"),
    ("test_linear_attention_gated_delta_gqa", "q_num_heads", None, 4, "q_num_heads 4"),
    ("test_linear_attention_linear", "kv_num_heads", None, 2, "'kv_num_heads' is 2"),
    ("test_rotary_embedding", "rotary_embedding_dim", None, BIG, "rotary_embedding_dim 2147483648"),
    ("test_rotary_embedding_3d_input", "num_heads", None, 2, "num_heads 2"),
    ("test_rotary_embedding_with_rotary_dim", "rotary_embedding_dim", None, 0, "rotary_embedding_dim being 0"),
    ("test_reshape_zero_dim", "allowzero", None, BIG, "allowzero = 2147483648: a 0 is an empty dim"),
    ("test_reshape_allowzero_reordered", "allowzero", None, 0, "allowzero = 0: a 0 is a copy of the input dim"),
    ("test_gather_0", "axis", None, 3, "is outside [-2, 2), the size of axis 3"),
    ("test_scatter_elements_with_axis", "axis", None, 0, "is outside [-1, 1), the size of axis 0"),
    ("test_gathernd_example_int32", "batch_dims", None, 1, "after batch_dims = 1"),
    ("test_split_2d_uneven_split_opset18", "axis", None, 0, "the size of axis 0, the split dim"),
    ("test_split_to_sequence_2", "axis", None, 1, "the size of axis 1"),
    ("test_tensorscatter", "axis", None, 3, "the size of axis 3"),
    ("test_scan_sum", "num_scan_inputs", None, 3, "num_scan_inputs = 3, expected in [1, 2]"),
    ("test_scan_sum", "num_scan_inputs", None, BIG, "num_scan_inputs = 2147483648"),
    ("test_scan9_sum", "num_scan_inputs", None, 2, "last 2 inputs (num_scan_inputs) disagree"),
    ("test_averagepool_2d_same_upper", "kernel_shape", 0, TOP, "SAME_UPPER padding keeps the padded input within"),
    ("test_lppool_2d_same_lower", "kernel_shape", 1, TOP, "SAME_LOWER padding keeps the padded input within"),
    ("test_maxpool_2d_same_upper", "kernel_shape", 0, TOP, "pad the input [32, 32] to [2147483678, 33]"),
    ("test_maxunpool_export_without_output_shape", "kernel_shape", 0, TOP, "the inferred output"),
    ("test_maxunpool_export_with_output_shape", "kernel_shape", 0, 5, "that kernel_shape [5, 2]"),
    ("test_convtranspose_pads", "strides", 0, TOP, "the untrimmed output"),
    ("test_convtranspose_dilations", "dilations", 1, TOP, "the untrimmed output"),
]


@pytest.mark.parametrize("name, attribute, index, value, said", NODE_MUTANTS)
def test_a_node_case_mutant_names_its_attribute(cases, name, attribute, index, value, said):
    assert said in _line(cases[name], attribute, value, index)


def test_a_block_longer_than_the_axis_is_one_block_and_allocates_nothing_more(cases):
    """block_size 2³¹ − 1 on an axis of 4 (it asked for 24 GiB): one block, as block_size 4 gives."""
    import engine

    case = cases["test_dequantizelinear_blocked"]
    with attribute_fuzz.address_space_cap(4):
        outs = [next(iter(engine.load(attribute_fuzz.Mutant(case, "block_size", None, v).model_bytes())
                          .run(case.feeds).values())) for v in (4, TOP)]
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("name, attribute, value, said", [
    ("GroupQueryAttention/prompt-b2s4-h4/2x16-do_rotary-qk_output1-out4", "num_heads", 2, "query's 64 / num_heads 2"),
    ("RotaryEmbedding/3d-2x3-h2x8-pos1-num_heads2-rotary_embedding_dim4", "rotary_embedding_dim", 0,
     "rotary_embedding_dim being 0"),
    ("RotaryEmbedding/3d-2x3-h2x8-pos2x3-num_heads2", "num_heads", 4, "input's 16 / num_heads 4"),
    ("FusedMatMul/r2-alpha2-transB1", "transB", 0,
     "its K dim is 5, expected 4 (transB = 0 makes B's K dim 5, transA = 0 makes A's 4)"),
    ("FusedMatMul/r3-transBatchA1", "transBatchA", 0, "transBatchA = 0 leaves A's batch dims [3]"),
    ("FusedMatMul/r3-alpha2-transBatchB1", "transBatchB", 0, "transB = 0, transBatchB = 0 make B's K dim 2"),
])
def test_contrib_mutants_name_the_attribute(name, attribute, value, said):
    assert said in _line(_contrib(name), attribute, value)


def test_a_roialign_sampling_ratio_whose_grid_is_too_large_names_it(cases):
    line = _line(cases["test_roialign_aligned_false"], "sampling_ratio", BIG)
    assert "'sampling_ratio' is 2147483648, expected in [0, " in line and "sample grid" in line


def test_what_ran_still_runs(cases):
    """The new checks refuse nothing in range: the cases themselves and in-range neighbours run."""
    with attribute_fuzz.address_space_cap(4), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, attribute, index, value in (
                ("test_maxpool_2d_precomputed_same_upper", "kernel_shape", 0, TOP), ("test_dft", "inverse", None, 1),
                ("test_sce_mean_weight_ii", "ignore_index", None, 0), ("test_quantizelinear", "precision", None, 1)):
            outcome, line = attribute_fuzz.exercise(attribute_fuzz.Mutant(cases[name], attribute, index, value))
            assert outcome == "ran", (name, attribute, value, line)
