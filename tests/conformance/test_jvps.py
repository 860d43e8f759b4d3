"""The JVP sweep (engine/conformance/jvps.py): forward mode on onnx's node cases, against float64 central
differences along v and against reverse mode by the transpose identity.

The rule of issue 36 (a case whose VJP check passes passes its JVP check too) is asserted on the doc
run's gradient sample in tests/conformance/test_sweeps.py; the full sweep is recorded in
tests/jvp_floor.json (`python scripts/gen_ops_doc.py --jvp`), which this module holds to its rule.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.conformance import case_named
from engine.conformance.jvps import check_case, compare_jvp, transpose_residual
from engine.conformance.status import FAIL, INCONCLUSIVE, NO_FORWARD_RULE, NONFINITE, PASS
from engine.verify import register_op_with_vjp
from tests import paths

JVP_FLOOR = json.loads((paths.ROOT / "tests" / "jvp_floor.json").read_text())


def _sin_vjp(grads, inputs, outputs):
    return (grads[0] * torch.cos(inputs[0]),)


def _sin_jvp(tangents, inputs, outputs):
    return tangents[0] * torch.cos(inputs[0])


@pytest.mark.parametrize("name", ["test_sin_example", "test_softmax_axis_0", "test_conv_with_strides_padding",
                                  "test_layer_normalization_2d_axis0_expanded", "test_gemm_all_attributes"])
def test_smooth_cases_pass_forward_and_transpose(name):
    outcome = check_case(case_named(name))
    assert outcome.status == PASS, outcome.reason
    assert outcome.max_rel_err < 1e-6 and outcome.transpose_residual < 1e-12


def test_a_wrong_jvp_fails_against_finite_differences():
    """Sin's forward rule replaced by 2·cos (its VJP right): the forward comparison must fail."""
    case = case_named("test_sin_example")

    def wrong_jvp(tangents, inputs, outputs):
        return 2 * tangents[0] * torch.cos(inputs[0])

    with register_op_with_vjp("Sin", torch.sin, _sin_vjp, since=7, jvp=wrong_jvp):
        outcome = check_case(case)
    assert outcome.status == FAIL and "finite differences" in outcome.reason, outcome.reason
    with register_op_with_vjp("Sin", torch.sin, _sin_vjp, since=7, jvp=_sin_jvp):
        assert check_case(case).status == PASS  # the same custom op with the right rule passes


def test_a_wrong_vjp_breaks_the_transpose_identity():
    """J·v right, Jᵀu wrong (2·cos): only the transpose identity can see it."""
    def wrong_vjp(grads, inputs, outputs):
        return (2 * grads[0] * torch.cos(inputs[0]),)

    with register_op_with_vjp("Sin", torch.sin, wrong_vjp, since=7, jvp=_sin_jvp):
        outcome = check_case(case_named("test_sin_example"))
    assert outcome.status == FAIL and outcome.reason.startswith("dy: transpose"), outcome.reason
    assert outcome.transpose_residual > 0.1


def test_an_op_without_a_forward_rule_is_named():
    with register_op_with_vjp("Sin", torch.sin, _sin_vjp, since=7):
        outcome = check_case(case_named("test_sin_example"))
    assert outcome.status == NO_FORWARD_RULE, outcome.reason
    assert "(Sin)" in outcome.reason and "register a jvp" in outcome.reason


def test_a_declared_zero_derivative_passes_and_a_dropped_tangent_goes_through_the_vjp():
    """Hardmax's rule is dX = 0 (piecewise constant): its missing tangent is that zero. torch's
    scatter_reduce('prod') drops a tangent it should carry: the engine takes that node's J·v from its
    VJP (engine/forward/by_vjp.py), which differences and the transpose identity confirm."""
    assert check_case(case_named("test_hardmax_example")).status == PASS
    outcome = check_case(case_named("test_scatternd_multiply"))
    assert outcome.status == PASS, outcome.reason


def test_compare_calls_a_kink_inconclusive_and_a_wrong_slope_a_failure():
    """|x| at 0 along v: one-sided differences disagree at every step, so no verdict; away from 0 a
    slope off by 1% is a failure."""
    x, v, h = np.array([0.0, 1.0]), np.array([1.0, -2.0]), 1e-6
    f = np.abs
    runs = [f(x + t * v) for t in (h, -h, h / 2, -h / 2)]
    status, reason, _ = compare_jvp(np.sign(x) * v, f(x), *runs, h)
    assert status == INCONCLUSIVE and "kink" in reason
    x = np.array([0.5, 1.0])
    runs = [f(x + t * v) for t in (h, -h, h / 2, -h / 2)]
    assert compare_jvp(np.sign(x) * v, f(x), *runs, h)[0] == PASS
    assert compare_jvp(np.sign(x) * v * 1.01, f(x), *runs, h)[0] == FAIL


def test_transpose_residual_is_zero_only_for_the_transpose():
    rng = np.random.default_rng(0)
    J, u, v = rng.standard_normal((3, 4)), rng.standard_normal(3), rng.standard_normal(4)
    assert transpose_residual(u, J @ v, {"x": J.T @ u}, {"x": v})[2] < 1e-15
    assert transpose_residual(u, J @ v, {"x": J.T @ u * 1.001}, {"x": v})[2] > 1e-5


def test_documented_nonfinite_keeps_its_reason():
    outcome = check_case(case_named("test_acosh_example"))  # x = 1: Acosh's derivative is infinite
    assert outcome.status == NONFINITE and "Acosh" in outcome.documented


def test_recorded_full_sweep_keeps_the_rule():
    """The recorded sweep over every forward-passing case (`python scripts/gen_ops_doc.py --jvp`): a case
    whose VJP check passes and JVP check does not is an op torch's forward AD lacks, named (jvps.NO_RULE)."""
    assert JVP_FLOOR["cases"] >= 1000
    vjp_pass = JVP_FLOOR["vjp"][PASS]
    assert vjp_pass > 0 and JVP_FLOOR["jvp"][PASS] >= vjp_pass - len(JVP_FLOOR["exceptions"])
    assert all(e["vjp"] == PASS and e["jvp"] == NO_FORWARD_RULE and e["documented"] for e in JVP_FLOOR["exceptions"])
    assert len(JVP_FLOOR["passing"]) == JVP_FLOOR["jvp"][PASS]


def test_a_shape_jump_is_inconclusive():
    outcome = check_case(case_named("test_range_float_type_positive_delta"))  # (limit - start) / delta = 2
    assert outcome.status == INCONCLUSIVE and "shape" in outcome.reason, outcome.reason


def test_a_scalar_exponent_and_batch_statistics_keep_their_tangents():
    """Two fast paths took a constant on `requires_grad` alone, which a dual tensor under no_grad does not
    set: Pow's Python-number exponent and BatchNorm's fused kernel dropped the tangents of y and mean."""
    from engine import load

    case = case_named("test_pow_bcast_scalar")
    x = np.array([1.0, 2.0, 3.0])
    res = load(case.model).jvp("z", ["x", "y"], {"x": np.zeros(3), "y": np.ones(())}, feeds={"x": x, "y": 2.0},
                               dtype="float64")
    np.testing.assert_allclose(res.jvp, x ** 2 * np.log(x), rtol=1e-12)  # d(x^y)/dy = x^y log x

    case = case_named("test_batchnorm_example")
    inputs = [np.asarray(a, np.float64) for a in case.data_sets[0][0]]
    names = [i.name for i in case.model.graph.input]
    feeds = dict(zip(names, inputs))
    tangents = {n: (np.ones_like(a) if n == "mean" else np.zeros_like(a)) for n, a in feeds.items()}
    res = load(case.model).jvp("y", names, tangents, feeds=feeds, dtype="float64")
    scale = -feeds["s"] / np.sqrt(feeds["var"] + 1e-5)  # dy/dmean, per channel
    np.testing.assert_allclose(res.jvp, np.broadcast_to(scale[None, :, None, None], res.jvp.shape), rtol=1e-12)


def test_cli_conformance_jvp(capsys):
    from engine.cli import main

    assert main(["conformance", "--op", "Relu", "--op", "Sin", "--gradients", "--jvp", "--show", "all"]) == 0
    out = capsys.readouterr().out
    assert "jvp: 4 pass" in out and "VJP passes, JVP does not: 0 of 4 cases" in out
    assert main(["conformance", "--op", "Sin", "--jvp", "--dtype", "float16"]) == 2
    assert "--jvp" in capsys.readouterr().err
