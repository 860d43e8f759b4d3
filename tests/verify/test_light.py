"""The onnx package's light/ models: real architectures, weights fed as intermediates, no false alarm."""
import os

import numpy as np
import pytest

import engine
from tests.verify_models import light_feeds, light_path, light_selection

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def squeezenet():
    path = light_path("squeezenet")
    if not os.path.exists(path):
        pytest.skip("onnx's light/ data is not installed")
    model = engine.load(path)
    feeds, made = light_feeds(model, seed=0)
    return model, feeds, made


def test_squeezenet_image_gradient_fast_mode_raises_no_false_alarm(squeezenet):
    model, feeds, _ = squeezenet
    xs = [model.inputs[0]]
    y, zs = light_selection(model, xs)
    report = engine.check(model, y, xs, zs, feeds=feeds, mode="fast", directions=2)
    (r,) = report.results
    # Two random directions and the gradient's own (and, for a coarse one, its aligned-dy twin).
    assert r.kind == "directions" and r.checked >= 3 and r.strategy in ("vmap", "loop")
    # No false alarm. A direction through this many Relu/MaxPool kinks may cross some within the
    # step; whether finite differences then resolve rtol 1e-4 depends on the CPU's summation order,
    # so such a direction may end inconclusive, with that reason, never failed.
    assert r.failed == 0 and report.verdict in ("pass", "inconclusive"), report.summary()
    assert r.inconclusive < r.checked, report.summary()
    # (or, where the CPU's order puts the point within a step of a kink, says so: seen at b4135ed too)
    assert report.verdict == "pass" or any(why in report.summary() for why in (
        "finite differences are not accurate enough", "a kink or jump lies within one step"))


def test_squeezenet_late_weights_sampled_and_the_nodes_checked(squeezenet):
    """Perturbing a late layer only re-runs the nodes after it; per-node checks see the real values."""
    model, feeds, made = squeezenet
    xs = [made[-1], made[-2]]
    y, zs = light_selection(model, xs)
    report = engine.check(model, y, xs, zs, feeds=feeds, mode="sample", samples=8, per_node=True)
    assert report.verdict == "pass", report.summary()
    assert all(r.checked == 8 for r in report.results)
    assert report.nodes and not any(n.status == "fail" for n in report.nodes)


def test_squeezenet_with_its_constant_weights_is_no_false_alarm():
    """The shipped weights are ConstantOfShape 0.02: every class gets the same logit, softmax is
    1/1000 whatever the image, so d softmax / d image is exactly 0. Finite differences see y not
    move; the float64 VJP keeps the roundoff of cancelling terms (about 5e-10 on one direction),
    above what those exact zeros resolve: it would fail without the analytic side's own roundoff
    allowed for (Context.analytic_roundoff)."""
    path = light_path("squeezenet")
    if not os.path.exists(path):
        pytest.skip("onnx's light/ data is not installed")
    model = engine.load(path)
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    report = engine.check(model, model.outputs[0], [model.inputs[0]], feeds={model.inputs[0]: image}, mode="fast")
    (r,) = report.results
    # Exact zeros against roundoff resolve nothing: no failure, and no pass at the model level. The
    # nodes cannot settle it either: MaxPool ties among Relu zeros and a Softmax over logits of
    # 6.7e9 are kinks and saturations when perturbed alone.
    assert r.failed == 0 and report.verdict == "inconclusive", report.summary()
    assert "does not resolve" in r.reason or "not accurate enough" in r.reason, r.reason


def test_squeezenet_last_bias_with_its_own_values_is_no_false_alarm():
    """With the shipped constant weights the logits are 6.7e9 (ulp 1e-6): the default step of 1e-6
    on conv10's bias is rounded away and finite differences read 0 against a gradient of 7e-4; larger
    steps, taken where values downstream are that large (verify/absorbed.py), resolve it."""
    path = light_path("squeezenet")
    if not os.path.exists(path):
        pytest.skip("onnx's light/ data is not installed")
    model = engine.load(path)
    report = engine.check(model, model.outputs[0], ["conv10_b_0"], [model.inputs[0]], mode="sample")
    (r,) = report.results
    assert report.verdict == "pass" and r.checked == 64 and r.numeric != 0.0, report.summary()
    report = engine.check(model, model.outputs[0], ["conv10_b_0"], [model.inputs[0]], mode="fast")
    (r,) = report.results
    assert report.verdict == "pass", report.summary()
    assert abs(r.numeric - r.analytic) <= 1e-4 * abs(r.analytic), report.summary()
