"""The explorer on a file with onnxruntime's contrib ops (what its optimizer and quantizer write): it opens,
computes the gradient, and step mode writes each contrib node's local rule like any other op's."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from engine.conformance.contrib_cases_quant import pack_bits
from explorer.app import make_app
from explorer.screens.step import StepScreen, describe

from .conftest import SIZE, settle, started

MS = "com.microsoft"


def _contrib_model(path):
    """x → SkipLayerNormalization → FastGelu → MatMulNBits (4-bit) → y, with the initializers the tools write."""
    rng = np.random.default_rng(0)
    hidden, n, block = 16, 4, 16
    inits = {
        "skip": rng.standard_normal((1, 3, hidden)).astype(np.float32),
        "gamma": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "beta": rng.standard_normal(hidden).astype(np.float32), "fc_bias": rng.standard_normal(hidden).astype(np.float32),
        "B": pack_bits(rng.integers(0, 16, (n, hidden)), 4).reshape(n, 1, -1),
        "scales": rng.uniform(0.05, 0.2, (n, 1)).astype(np.float32),
    }
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["normed"], domain=MS,
                              epsilon=1e-5, name="skip_ln"),
             helper.make_node("FastGelu", ["normed", "fc_bias"], ["act"], domain=MS, name="fast_gelu"),
             helper.make_node("MatMulNBits", ["act", "B", "scales"], ["y"], domain=MS, K=hidden, N=n, bits=4,
                              block_size=block, name="matmul_4bit")]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, n])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    path.write_bytes(model.SerializeToString())
    return str(path)


async def test_contrib_model_opens_runs_and_steps_with_its_rules(tmp_path):
    app = make_app(_contrib_model(tmp_path / "contrib.onnx"))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        s = app.session
        s.select("y", ["x", "gamma", "fc_bias", "scales"])
        app.selection_changed()
        await pilot.press("r")
        await settle(app, pilot)
        assert s.gradient is not None and all(np.abs(g).max() > 0 for g in s.gradient.grads.values())
        await pilot.press("s")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StepScreen) and screen.trace.complete
        console = Console(record=True, width=240)
        for k, frame in enumerate(screen.trace.frames):
            console.print(describe(frame, k, screen.trace))
        text = console.export_text()
        for line in ("dscales = Σ over each block of (dYᵀ · A) ⊙ (q − zero)", "[scales = scales]",
                     "dbias = Σ over the leading axes of dY · FastGelu′(X + bias)", "[bias = fc_bias]",
                     "dgamma = Σ dY · Ŝ over the leading axes", "[gamma = gamma]"):
            assert line in text, line
        rules = {o.tensor: o.rule for f in screen.trace.frames for o in f.outgoing}
        assert rules["scales"].startswith("dscales = Σ over each block") and rules["B"] is None
        assert rules["fc_bias"].startswith("dbias = Σ over the leading axes of dY · FastGelu′")
        assert rules["gamma"].startswith("dgamma = Σ dY · Ŝ") and rules["x"].startswith("dinput = ")
        for x in s.spec.xs:
            np.testing.assert_allclose(screen.trace.grads[x], s.gradient.grads[x], rtol=1e-4, atol=1e-6)
