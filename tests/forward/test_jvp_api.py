"""Model.jvp / Model.hvp around the edges: custom ops with and without a forward rule, a step that drops
a tangent, the fused attention's fallback, tangents given wrong, linearity in v, and the CLI."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine import registry
from engine.cli import main
from engine.examples import custom_op
from tests.fusion_models import vit_block, vit_input

SAMPLES = "sample_models"


def central(model, y, xs, values, tangents, eps=1e-6):
    plus = {k: v + eps * tangents[k] if k in xs else v for k, v in values.items()}
    minus = {k: v - eps * tangents[k] if k in xs else v for k, v in values.items()}
    run = lambda f: model.run(f, outputs=[y], dtype="float64")[y]  # noqa: E731
    return (run(plus) - run(minus)) / (2 * eps)


def rel(a, b) -> float:
    return float(np.linalg.norm(np.ravel(a) - np.ravel(b)) / max(np.linalg.norm(np.ravel(b)), 1e-30))


def forward_fn(a):
    return a * a + torch.sin(a)


def right_vjp(grads, inputs, outputs):
    (g,), (a,) = grads, inputs
    return (g * (2 * a + torch.cos(a)),)


def right_jvp(tangents, inputs, outputs):
    (t,), (a,) = tangents, inputs
    return t * (2 * a + torch.cos(a))


def test_a_custom_op_with_a_jvp_matches_differences_and_one_without_is_named():
    with engine.register_op_with_vjp("MyCustomOp", forward_fn, right_vjp, domain="com.example", jvp=right_jvp):
        model = engine.load(custom_op())
        got = model.jvp("Y", ["X"], "random", dtype="float64")
        assert rel(got.jvp, central(model, "Y", ["X"], got.values, got.tangents)) < 1e-8
    with engine.register_op_with_vjp("MyCustomOp", forward_fn, right_vjp, domain="com.example"):
        model = engine.load(custom_op())
        with pytest.raises(engine.ForwardModeError, match=r"^node 'custom' \(MyCustomOp\) has no forward-mode rule"):
            model.jvp("Y", ["X"], "random", dtype="float64")
        # the branch that avoids it still has its J·v
        z = model.jvp("Z", ["X"], "ones", dtype="float64")
        assert rel(z.jvp, central(model, "Z", ["X"], z.values, z.tangents)) < 1e-8


def test_a_step_that_drops_the_tangent_is_named_never_a_silent_zero():
    @registry.register("Detached", domain="com.example")
    def detached(a):
        return torch.from_numpy(np.tanh(a.detach().numpy()))  # rebuilt outside autograd

    try:
        model = engine.load(_one_node("Detached", "com.example"))
        with pytest.raises(engine.ForwardModeError, match=r"node 'n' \(Detached\) .*gives none back"):
            model.jvp("Y", ["X"], "ones", dtype="float64")
    finally:
        registry.remove("com.example", "Detached", 1)


def _one_node(op: str, domain: str = ""):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node(op, ["X"], ["Y"], name="n", domain=domain)], "g", [x], [y])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_the_fused_attention_falls_back_to_its_ops_and_agrees():
    model = engine.load(vit_block())
    x = vit_input(dtype=np.float64)
    prepared = model.prepare_jvp("y", ["x", "wq"], dtype="float64")
    assert any(s.op_type == "FusedAttention" for s in prepared.plan.run_steps)
    first = model.jvp("y", ["x", "wq"], "random", feeds={"x": x}, dtype="float64")
    second = model.jvp("y", ["x", "wq"], "random", feeds={"x": x}, dtype="float64")
    # the first call walks the unfused steps; the second runs the fused step on torch's math kernel
    np.testing.assert_allclose(second.jvp, first.jvp, rtol=1e-10, atol=1e-12)
    assert rel(first.jvp, central(model, "y", ["x", "wq"], first.values, first.tangents)) < 1e-7


@pytest.mark.parametrize("tangents, message", [
    ({"X": np.ones((3, 3))}, r"tangent for 'X' has shape \(3, 3\), but 'X' has shape \(4, 8\)"),
    ({"Q": np.ones((4, 8))}, r"tangent for 'Q', which is not in xs"),
    ({}, r"no tangent for 'X'"),
    ("sideways", r"tangent for 'X' is 'sideways'"),
    ({"X": np.full((4, 8), "a")}, r"tangent for 'X' holds <U1 values"),
])
def test_tangents_given_wrong_are_one_line_feed_errors(tangents, message):
    model = engine.load(f"{SAMPLES}/mlp.onnx")
    with pytest.raises(engine.FeedError, match=message) as err:
        model.jvp("loss", ["X"], tangents)
    assert "\n" not in str(err.value)


def test_hvp_needs_a_scalar_y():
    model = engine.load(f"{SAMPLES}/small_cnn.onnx")
    with pytest.raises(engine.SelectionError, match=r"H·v needs a scalar y: 'logits' has shape \(2, 5\)"):
        model.hvp("logits", ["conv1_W"], "ones")


@settings(max_examples=20, deadline=None)
@given(a=st.floats(-3, 3), b=st.floats(-3, 3), seed=st.integers(0, 2**16))
def test_jvp_is_linear_in_the_tangent_and_hvp_in_the_direction(a, b, seed):
    model = engine.load(f"{SAMPLES}/transformer_block.onnx")
    xs = ["X", "ln1_scale"]
    r1 = model.jvp("loss", xs, "random", dtype="float64", seed=seed)
    r2 = model.jvp("loss", xs, "random", dtype="float64", seed=seed + 1)
    mixed = {n: a * r1.tangents[n] + b * r2.tangents[n] for n in xs}
    got = model.jvp("loss", xs, mixed, dtype="float64", seed=seed)
    assert np.allclose(got.jvp, a * r1.jvp + b * r2.jvp, rtol=1e-9, atol=1e-9)
    h1 = model.hvp("loss", xs, r1.tangents, dtype="float64", seed=seed)
    h2 = model.hvp("loss", xs, r2.tangents, dtype="float64", seed=seed)
    # H is symmetric: ⟨v2, H v1⟩ = ⟨v1, H v2⟩
    left = sum(float((r2.tangents[n] * h1.hvp[n]).sum()) for n in xs)
    right = sum(float((r1.tangents[n] * h2.hvp[n]).sum()) for n in xs)
    assert abs(left - right) <= 1e-8 * max(1.0, abs(left))


def test_jvp_and_gradient_satisfy_the_transpose_identity_on_every_sample():
    for name, y, xs in [("mlp", "loss", ["X", "W1"]), ("small_cnn", "logits", ["X", "conv1_W"]),
                        ("transformer_block", "loss", ["X", "ln1_scale"]), ("lstm_step", "loss", ["X"]),
                        ("spec_grad_wrt_h", "Y", ["X", "H_1"]), ("residual_fanout", "loss", ["X", "W"])]:
        model = engine.load(f"{SAMPLES}/{name}.onnx")
        fwd = model.jvp(y, xs, "random", dtype="float64", seed=5)
        u = np.random.default_rng(9).standard_normal(fwd.y.shape)
        rev = model.gradient(y, xs, dy=u, dtype="float64", seed=5)
        left = float((u * fwd.jvp).sum())
        right = sum(float((rev.grads[n] * fwd.tangents[n]).sum()) for n in xs)
        assert abs(left - right) <= 1e-10 * max(1.0, abs(left)), name
        assert rel(fwd.jvp, central(model, y, xs, fwd.values, fwd.tangents)) < 1e-6, name


def test_cli_jvp_and_grad_hvp(tmp_path, capsys):
    out = tmp_path / "jvp.npz"
    assert main(["jvp", f"{SAMPLES}/mlp.onnx", "--y", "loss", "--xs", "X,W1", "--dtype", "float64",
                 "--out", str(out)]) == 0
    saved = np.load(out)
    model = engine.load(f"{SAMPLES}/mlp.onnx")
    want = model.jvp("loss", ["X", "W1"], {"X": saved["tangent:X"], "W1": saved["tangent:W1"]}, dtype="float64")
    assert np.allclose(saved["loss"], want.jvp)
    np.savez(tmp_path / "v.npz", W1=np.ones((8, 16)))
    assert main(["grad", f"{SAMPLES}/mlp.onnx", "--y", "loss", "--xs", "W1", "--hvp", str(tmp_path / "v.npz"),
                 "--dtype", "float64", "--out", str(tmp_path / "g.npz")]) == 0
    g = np.load(tmp_path / "g.npz")
    assert np.allclose(g["hvp:W1"], model.hvp("loss", ["W1"], "ones", dtype="float64").hvp["W1"])
    assert "H·v block W1" in capsys.readouterr().out
    assert main(["jvp", f"{SAMPLES}/mlp.onnx", "--y", "loss", "--xs", "X", "--tangent", "up"]) == 2
    assert main(["grad", f"{SAMPLES}/small_cnn.onnx", "--y", "logits", "--xs", "conv1_W", "--hvp", "ones"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--tangent 'up'" in err[0] and "H·v needs a scalar y" in err[1]


def test_an_op_torch_has_no_forward_rule_for_goes_through_its_vjp_exactly():
    """GridSample: torch's forward AD lacks grid_sampler_2d; its J·v comes from its VJP (by_vjp.py)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 4, 5])
    grid = helper.make_tensor_value_info("G", TensorProto.FLOAT, [1, 3, 3, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 3, 3])
    graph = helper.make_graph([helper.make_node("GridSample", ["X", "G"], ["Y"], name="sample", align_corners=1)],
                              "g", [x, grid], [y])
    model = engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]))
    rng = np.random.default_rng(0)
    feeds = {"X": rng.standard_normal((1, 2, 4, 5)), "G": rng.uniform(-0.9, 0.9, (1, 3, 3, 2))}
    got = model.jvp("Y", ["X", "G"], "random", feeds=feeds, dtype="float64")
    assert rel(got.jvp, central(model, "Y", ["X", "G"], got.values, got.tangents)) < 1e-7
    prepared = model.prepare_jvp("Y", ["X", "G"], dtype="float64")
    assert prepared.through_vjp == {0}
    rev = model.gradient("Y", ["X", "G"], feeds=feeds, dy=np.ones((1, 2, 3, 3)), dtype="float64")
    assert np.isclose(got.jvp.sum(), sum((rev.grads[n] * got.tangents[n]).sum() for n in ("X", "G")), rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_random_tangent_is_one_draw_cast_without_holding_it(dtype):
    """A "random" tangent is drawn block by block into x's dtype: the numbers of one float64 draw cast."""
    from engine.forward.call import direction
    from engine.gradient.feeds import DRAW_BLOCK

    like = torch.zeros((2, DRAW_BLOCK + 3), dtype=dtype)
    want = torch.from_numpy(np.random.default_rng((5, 1)).standard_normal(tuple(like.shape))).to(dtype)
    got = direction("w", "random", like, 5, 1)
    assert got.dtype == dtype and torch.equal(got, want)
