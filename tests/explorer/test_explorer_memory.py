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


async def test_a_failed_workers_error_keeps_nothing_its_job_computed():
    """The Worker keeps its error and the error's traceback keeps the Worker's frame: a cycle the
    explorer's collector (off while keys arrive) was left to break, with the failed pass's values in it."""
    import gc
    import weakref

    import torch
    from textual.app import App
    from textual.worker import WorkerFailed, WorkerState

    from engine.errors import OnnxGradError
    from explorer.host import in_thread

    kept = []

    def job():
        value = torch.ones(1 << 16)
        kept.append(weakref.ref(value))
        raise OnnxGradError("node 'n' (Unsqueeze): axis out of range")

    app = App()
    collector_on = gc.isenabled()
    gc.disable()
    try:
        async with app.run_test():
            worker = in_thread(app, "values", job)
            try:
                await worker.wait()
            except WorkerFailed:
                pass
            assert worker.state == WorkerState.ERROR and "out of range" in str(worker.error)
            assert kept and kept[0]() is None
            assert worker.error.__traceback__ is not None  # where it failed is still there to show
    finally:
        if collector_on:
            gc.enable()


async def test_a_failed_values_pass_leaves_no_job_behind():
    """The frames still running when the job failed (Textual's, the job's own call) are released once
    the app hears of the failure: the job and its feeds are not kept until the next collection."""
    import gc
    import weakref

    import torch

    from engine.errors import OnnxGradError

    kept = []

    class FailingJob:
        generation, names = 0, ()

        def __init__(self):
            self.feeds = {"X": torch.ones(1 << 16)}
            kept.append(weakref.ref(self.feeds["X"]))

        def run(self):
            raise OnnxGradError("node 'n' (Unsqueeze): axis out of range")

    app = make_app(sample("small_cnn.onnx"), select_from_gradient_node=False)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert not gc.isenabled()  # the app collects on its own timer
        app.work.run_values(FailingJob())
        await settle(app, pilot)
        await pilot.pause()
        assert any("out of range" in n.message for n in app._notifications)
        assert kept and kept[0]() is None


def test_a_weights_value_in_float64_is_the_weight_as_stored():
    """Cast up, a weight is exactly what is stored: the inspector and a gradient's values show the
    model's own array rather than a float64 copy of it (GPT-2's embedding: 0.29 GB more)."""
    import engine
    from explorer.jobs import GradientJob, ValuesJob

    model = engine.load(sample("small_cnn.onnx"))
    stored = model.constants()["fc_W"].numpy()
    x = np.random.default_rng(0).standard_normal(model.graph.types["X"].shape if all(
        isinstance(d, int) for d in model.graph.types["X"].shape) else (1, 1, 8, 8)).astype(np.float32)
    values = ValuesJob(model, {"X": x}, ("fc_W", "logits"), "cpu", "float64", 0).run()
    assert np.shares_memory(values["fc_W"], stored) and not values["fc_W"].flags.writeable
    assert values["logits"].dtype == np.float64
    result, _ = GradientJob(model, model.selection("logits", ["fc_W"], ["X"]), {"X": x}, "cpu", "float64", 0).run()
    assert np.shares_memory(result.values["fc_W"], stored)
    assert result.grads["fc_W"].dtype == np.float64
    plain = model.gradient("logits", ["fc_W"], ["X"], {"X": x}, dtype="float64")
    np.testing.assert_array_equal(result.grads["fc_W"], plain.grads["fc_W"])
    np.testing.assert_array_equal(result.values["fc_W"], plain.values["fc_W"])  # the same numbers
    half = ValuesJob(model, {"X": x}, ("fc_W",), "cpu", "float16", 0).run()["fc_W"]  # rounded: computed
    assert half.dtype == np.float16 and not np.shares_memory(half, stored)
