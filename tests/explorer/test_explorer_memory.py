"""The memory guard in the app: a gradient that would not fit is a notification naming the node and
the output, and the app stays usable (the same selection runs once memory is back)."""
from __future__ import annotations

import numpy as np

from engine.cli import main
from engine.run import memory
from explorer.app import make_app

from .conftest import SIZE, sample, settle, started


async def test_a_run_that_would_not_fit_is_a_notification_and_the_app_goes_on(monkeypatch, tmp_path):
    out = tmp_path / "cli.npz"
    assert main(["grad", sample("small_cnn.onnx"), "--y", "logits", "--xs", "fc_W", "--zs", "X", "--seed", "2",
                 "--out", str(out)]) == 0
    app = make_app(sample("small_cnn.onnx"), seed=2, select_from_gradient_node=False)
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.session.select("logits", ["fc_W"], ["X"])
        app.selection_changed()
        monkeypatch.setenv(memory.ENV, "1KiB")
        memory.forget_reading()
        await pilot.press("r")
        await settle(app, pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert app.session.gradient is None
        assert any(e.startswith("node 'conv1' (Conv): output 'c1' of shape [2, 4, 8, 8] float32 needs 2.0 KiB "
                                "(2048 bytes), more than the 1.0 KiB the machine can still give") for e in errors), errors
        monkeypatch.delenv(memory.ENV)
        memory.forget_reading()
        await pilot.press("r")
        await settle(app, pilot)
        result = app.session.gradient
        assert result is not None
    with np.load(out) as cli:  # the CLI's numbers for the same selection and seed
        np.testing.assert_allclose(result.grads["fc_W"], cli["fc_W"], rtol=1e-5, atol=1e-6)
    memory.forget_reading()
