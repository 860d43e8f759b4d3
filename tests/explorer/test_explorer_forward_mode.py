"""Step mode's forward-mode pass: tangents along v beside each forward frame, J·v at y as
`Model.jvp` computes it, and the transpose identity with the reverse pass's gradients on the last frame."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from explorer.screens.step import StepScreen
from explorer.stepper import trace

from .conftest import opened, plain, settle, spec_app


async def test_forward_frames_show_tangents_and_the_last_frame_ties_both_modes():
    app = spec_app()
    async with opened(app) as pilot:
        await pilot.press("s")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StepScreen) and screen.trace.complete
        text = plain(screen.query_one("#step-text"))
        first = screen.trace.frames[0]
        names = [n for n, _ in first.tangents_in]
        assert names and set(names) <= set(app.session.spec.xs)  # only xs carry a tangent into the first node
        rule = f"ṫ {first.outputs[0]} = " + " + ".join(f"∂{first.outputs[0]}/∂{n}·ṫ {n}" for n in names)
        assert "forward mode (tangents along v)" in text and rule in text, text
        await pilot.press("end")
        last = plain(screen.query_one("#step-text"))
        assert "The two modes are transposes" in last
        s = app.session
        want = s.model.jvp(s.spec.y, s.spec.xs, "random", s.spec.zs, feeds=s.feed_values(), dtype=s.dtype)
        mode = screen.trace.forward_mode
        assert np.allclose(mode.jvp.numpy(), want.jvp, rtol=1e-5, atol=1e-6)
        left, right = mode.identity(screen.trace.grads)
        assert abs(left - right) <= 1e-4 * max(1.0, abs(left))
        assert f"{left:.6g}" in last


def test_an_op_without_a_forward_rule_leaves_the_reverse_pass_alone():
    from engine.examples import custom_op

    def forward(a):
        return a * a

    def vjp(grads, inputs, outputs):
        return (2 * grads[0] * inputs[0],)

    with engine.register_op_with_vjp("MyCustomOp", forward, vjp, domain="com.example"):
        model = engine.load(custom_op())
        spec = model.selection("Y", ["X"])
        tr = trace(model, spec, {}, dtype="float64")
        assert tr.forward_mode.jvp is None and "no forward-mode rule" in tr.forward_mode.failure
        got = model.gradient("Y", ["X"], dtype="float64")
        assert np.allclose(tr.grads["X"], got.grads["X"])


@pytest.mark.parametrize("name, y, xs", [("mlp", "loss", ["W1", "X"]), ("transformer_block", "loss", ["Wq"])])
def test_the_traced_tangents_are_model_jvps(name, y, xs):
    model = engine.load(f"sample_models/{name}.onnx")
    tr = trace(model, model.selection(y, xs), {}, dtype="float64")
    want = model.jvp(y, xs, "random", dtype="float64")
    assert np.allclose(tr.forward_mode.jvp.numpy(), want.jvp, rtol=1e-12)
    # every forward frame whose node reads a tangent pushes one on
    assert all(f.tangents_out for f in tr.frames if f.phase == "forward" and f.tangents_in)
