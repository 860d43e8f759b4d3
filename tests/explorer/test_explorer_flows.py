"""Each flow of the explorer driven with Pilot, asserting on session state and posted messages."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper
from textual.widgets import DataTable

import engine
from explorer import messages as m
from explorer.app import make_app
from explorer.feeding import FeedSource
from explorer.screens.feed import FeedScreen
from explorer.screens.help import HelpScreen
from explorer.screens.step import StepScreen
from explorer.screens.verify import VerifyScreen
from explorer.state import CheckOptions

from .conftest import SIZE, of_type, plain, sample, settle, spec_app, started


async def test_start_opens_the_spec_example_with_its_gradient_selection(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        s = app.session
        assert (s.y, s.xs, s.zs) == ("Y", ("W", "Z"), ("X",)) and s.selection_error is None
        assert app.cursor == (None, "X") and of_type(seen, m.LayoutReady)
        graph = app.query_one("#graph")
        assert {n.id for n in graph.canvas.layout.nodes} >= {"t:X", "t:W", "t:Z", "n0"}
        assert graph.marks["t:W"] == "x" and graph.marks["t:X"] == "z" and graph.marks["t:Y"] == "y"
        assert graph.marks["n0"] == "slice" and graph.marks["n1"] == "dim"  # conv on it, Gradient off it
        assert app.query_one("#inspector").has_heatmap  # X's value was computed and drawn


async def test_a_model_that_cannot_load_is_explained_in_the_app(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not an onnx file")
    app = make_app(str(bad))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.session is None
        texts = [n.message for n in app._notifications]
        assert len(texts) == 1 and texts[0].startswith(f"cannot read {bad} as ONNX")


async def test_arrows_move_between_boxes_and_the_list_follows(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("down")
        await settle(app, pilot)
        moved = of_type(seen, m.CursorMoved)[-1]
        node = app.session.graph.nodes[moved.node_index]
        assert moved.tensor == node.output[0] and app.cursor == (moved.node_index, moved.tensor)
        listing = app.query_one("#node-options")
        assert listing.entries[listing.highlighted].node_index == moved.node_index
        await pilot.press("o")
        assert app.cursor[0] == moved.node_index and app.cursor[1] != moved.tensor


async def test_search_jumps_to_a_tensor_and_selection_keys_mark_it(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("slash", *"hfla", "enter")
        await settle(app, pilot)
        assert app.cursor == (None, "H_flat") and app.focused is app.query_one("#graph")
        await pilot.press("x")
        changed = of_type(seen, m.SelectionChanged)[-1]
        assert changed.xs == ("W", "Z", "H_flat") and "'H_flat' cannot be in xs" in changed.error
        assert "'H_flat' cannot be in xs: it is determined by" in plain(app.query_one("#selection-bar"))
        await pilot.press("x")
        assert app.session.spec is not None and of_type(seen, m.SelectionChanged)[-1].error is None
        await pilot.press("c")
        assert (app.session.y, app.session.xs, app.session.zs) == (None, (), ())


async def test_feed_dialog_sets_an_intermediate_and_reports_errors_inline(recorded):
    seen, hook = recorded
    app = spec_app(dtype="float64")
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        app.session.select("Y", ["H", "Z"])
        app.selection_changed()
        await pilot.press("slash", "H", "enter", "f")
        assert isinstance(app.screen, FeedScreen)
        await pilot.press("ctrl+u", *"=X[0, 0, 0, :5]", "enter")  # 5 values cannot fill H
        assert isinstance(app.screen, FeedScreen)
        assert "does not broadcast" in plain(app.screen.query_one("#feed-error"))
        await pilot.press("ctrl+u", *"=2 * X[0, 0, :2, :2]", "enter")
        await settle(app, pilot)
        assert not isinstance(app.screen, FeedScreen)
        assert of_type(seen, m.FeedChanged)[-1] == m.FeedChanged("H", "= 2 * X[0, 0, :2, :2]")
        await pilot.press("r")
        await settle(app, pilot)
        h = 2 * app.session.feed_values()["X"][0, 0, :2, :2]
        want = app.session.model.gradient("Y", ["H", "Z"], feeds={"H": np.broadcast_to(h, (1, 2, 2, 2))},
                                          dtype="float64")
        np.testing.assert_allclose(app.session.gradient.grads["Z"], want.grads["Z"], rtol=1e-12)
        assert app.session.gradient.values["H"][0, 1, 1, 1] == h[1, 1]


async def test_run_fills_the_gradient_table(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        ready = of_type(seen, m.GradientReady)[-1]
        want = app.session.model.gradient("Y", ["W", "Z"], ["X"], app.session.feed_values())
        np.testing.assert_allclose(ready.result.grads["W"], want.grads["W"], rtol=1e-6)
        table = app.query_one("#gradient-table", DataTable)
        assert table.row_count == 2
        norm = float(np.linalg.norm(want.grads["Z"].astype(np.float64)))
        assert table.get_row("Z")[2] == f"{norm:.4g}"
        assert of_type(seen, m.WorkFinished)[-1] == m.WorkFinished("gradient", "done")


async def test_verify_runs_the_check_and_fills_the_table(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("v")
        assert isinstance(app.screen, VerifyScreen)
        await pilot.click("#mode-fast")
        await pilot.click("#verify-run")
        await settle(app, pilot)
        report = of_type(seen, m.CheckReady)[-1].report
        assert report.mode == "fast" and report.verdict == "pass"
        assert app.session.check is report and app.session.check_options.mode == "fast"
        assert app.query_one("#verify-table", DataTable).row_count == 2
        assert of_type(seen, m.WorkProgress), "the check reported progress"
        await pilot.pause(0.2)
        keys = [k.key for k in app.screen.query_one("FittingFooter").shown()]
        assert "v" in keys and "escape" not in keys  # nothing left to cancel: the key left the footer


def _wrong_vjp_model():
    """X -> Twice (a custom op whose VJP is off by 1.5x) -> ReduceSum -> Y."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])
    nodes = [helper.make_node("Tanh", ["X"], ["T"], name="tanh"),
             helper.make_node("Twice", ["T"], ["D"], name="twice", domain="test.explorer"),
             helper.make_node("ReduceSum", ["D"], ["Y"], name="sum", keepdims=0)]
    g = helper.make_graph(nodes, "wrong_vjp", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.explorer", 1)])


async def test_verify_focuses_the_first_failing_node(recorded):
    engine.register_op_with_vjp("Twice", lambda t: 2 * t, lambda grads, inputs, outputs: (3 * grads[0],),
                                         domain="test.explorer")
    try:
        seen, hook = recorded
        app = make_app(model=engine.load(_wrong_vjp_model(), check=False), label="wrong")
        app.raise_errors = True
        async with app.run_test(size=SIZE, message_hook=hook) as pilot:
            await started(app, pilot)
            app.session.select("Y", ["X"])
            app.selection_changed()
            app.run_check(app.session.check_job(CheckOptions(per_node=True)))
            await settle(app, pilot)
            report = app.session.check
            assert report.verdict == "fail" and report.first_failing_node == "twice"
            assert app.cursor[0] == app.session.graph.node_names.index("twice")
            assert app.query_one("#graph").marks["n1"] == "fail"
            app.query_one("#verify-table", DataTable).focus()
            await pilot.press("enter")
            await settle(app, pilot)
            inspector = app.query_one("#inspector")
            assert app.cursor == (None, "X") and inspector.heat_source == "gradient"
            assert inspector.focus_element == tuple(report.results[0].worst_index)
    finally:
        engine.unregister_op("Twice", domain="test.explorer")


async def test_cancel_stops_a_running_check(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        job = app.session.check_job(CheckOptions(mode="full"))
        original = job.run

        def slow_run(progress=None, should_stop=None):
            import time

            while not should_stop():  # stands in for a long check that polls should_stop
                time.sleep(0.01)
            return original(progress, should_stop)

        object.__setattr__(job, "run", slow_run)
        app.run_check(job)
        await pilot.pause(0.1)
        assert app.check_action("cancel", ()) is True
        await pilot.press("escape")
        await settle(app, pilot)
        assert of_type(seen, m.WorkFinished)[-1] == m.WorkFinished("check", "cancelled")
        assert app.session.check is None and not of_type(seen, m.CheckReady)


async def test_worker_errors_become_notifications_not_tracebacks(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        app.session.select("Y", ["H", "Z"])
        app.session.feeds["H_flat"] = FeedSource("zeros")  # inside the cut graph: the engine refuses it
        await pilot.press("r")
        await settle(app, pilot)
        failed = of_type(seen, m.WorkFinished)[-1]
        assert failed.kind == "gradient" and failed.outcome == "failed"
        assert "computed inside the differentiated graph" in failed.detail
        assert any("computed inside" in n.message for n in app._notifications)


async def test_step_mode_walks_forward_then_reverse(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("s")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StepScreen) and screen.frame.phase == "forward"
        await pilot.press("n", "n", "n")
        assert screen.frame.phase == "reverse" and screen.frame.op_type == "Gemm"
        text = plain(screen.query_one("#step-text"))
        assert "dA = dY · Bᵀ" in text and "[A = H_flat]" in text
        graph = screen.query_one("#step-graph")
        assert graph.marks[graph.selected] == "current" and graph.canvas.nodes[graph.selected].node_index == 3
        await pilot.press("end", "p")
        assert screen.position == len(screen.trace.frames) - 2
        await pilot.press("escape")
        assert not isinstance(app.screen, StepScreen) and app.cursor[0] == screen.frame.node_index


async def test_views_device_and_dtype(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("g")
        await settle(app, pilot)
        layout = app.query_one("#graph").canvas.layout
        assert app.session.view == "backward" and any(n.role == "seed" for n in layout.nodes)
        await pilot.press("g")
        await settle(app, pilot)
        assert app.session.view == "combined"
        await pilot.press("t")
        assert of_type(seen, m.SettingsChanged)[-1] == m.SettingsChanged("cpu", "float64", "combined")
        assert app.check_action("cycle_device", ()) is _has_cuda()
        await pilot.press("r")
        await settle(app, pilot)
        assert app.session.gradient.grads["W"].dtype == np.float64


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


async def test_export_writes_gradients_report_and_graph(tmp_path, monkeypatch, recorded):
    seen, hook = recorded
    monkeypatch.chdir(tmp_path)
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.press("e", "enter")  # the dialog's defaults: gradients, named after the model
        await settle(app, pilot)
        with np.load(tmp_path / "spec_conv_gemm_grads.npz") as data:
            assert sorted(data.files) == ["W", "Z"]
        for what, name in (("gradients", "out.npz"), ("report", "out.json"), ("dot", "out.dot"), ("svg", "out.svg")):
            app.start_export(what, name)
            await settle(app, pilot)
        with np.load(tmp_path / "out.npz") as data:
            np.testing.assert_array_equal(data["W"], app.session.gradient.grads["W"])
        report = json.loads((tmp_path / "out.json").read_text())
        assert report["y"] == "Y" and "W" in report["gradients"]
        assert (tmp_path / "out.dot").read_text().startswith("digraph")
        assert (tmp_path / "out.svg").read_text().lstrip().startswith("<?xml")
        assert [d.what for d in of_type(seen, m.ExportDone)] == ["gradients", "gradients", "report", "dot", "svg"]
        app.start_export("report", str(tmp_path / "no" / "such" / "dir.json"))
        await settle(app, pilot)
        assert "folder" in of_type(seen, m.WorkFinished)[-1].detail


async def test_help_lists_every_binding_and_the_palette_has_every_action():
    from explorer.app import ExplorerApp
    from explorer.commands import COMMANDS

    assert all(b.id and b.description for b in ExplorerApp.BINDINGS)
    actions = {c[2].split("(")[0] for c in COMMANDS} | {c[2] for c in COMMANDS}  # a key with arguments: as written
    assert {b.action for b in ExplorerApp.BINDINGS} <= actions
    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "ctrl+p")
        await pilot.press(*"Switch dtype", "enter")
        await settle(app, pilot)
        assert app.session.dtype == "float64"


async def test_open_model_from_the_palette(recorded):
    seen, hook = recorded
    app = spec_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        app.run_open(sample("mlp.onnx"))
        await started(app, pilot)
        await settle(app, pilot)
        assert app.session.label == "mlp.onnx" and of_type(seen, m.ModelOpened)
        app.run_open("/no/such/model.onnx")
        await settle(app, pilot)
        assert app.session.label == "mlp.onnx"
        assert "no such file: /no/such/model.onnx" in of_type(seen, m.WorkFinished)[-1].detail


async def test_a_model_replaced_by_another_is_garbage_collected():
    """Each model is frozen out of the cyclic collector while open; the one it replaces is not kept."""
    import gc
    import weakref

    app = spec_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        first = weakref.ref(app.session.model)
        app.run_open(sample("mlp.onnx"))
        await started(app, pilot)
        await settle(app, pilot)
        assert app.session.label == "mlp.onnx" and app.query_one("#graph").canvas is not None
        gc.collect()
        assert first() is None
        assert gc.get_freeze_count() > 0  # the open model is frozen again


def test_launcher_exits_2_with_one_line_for_a_bad_model(capsys):
    from explorer.launcher import main

    assert main(["explore", "/no/such/model.onnx"]) == 2
    err = capsys.readouterr().err
    assert err == "onnxgrad: error: no such file: /no/such/model.onnx\n"
    assert main(["explore"]) == 2 and "required: MODEL" in capsys.readouterr().err


def test_launcher_delegates_subcommands_and_starts_the_app(monkeypatch, capsys):
    from explorer import launcher
    from explorer.app import ExplorerApp

    assert launcher.main(["ops"]) == 0 and "Gemm" in capsys.readouterr().out
    assert launcher.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: onnxgrad" in out and "onnxgrad explore MODEL" in out
    started_with = []
    monkeypatch.setattr(ExplorerApp, "run", lambda self: started_with.append(self.session.label))
    assert launcher.main([]) == 0
    assert launcher.main(["explore", sample("mlp.onnx"), "--dtype", "float64"]) == 0
    assert started_with == ["spec_conv_gemm", "mlp.onnx"]


@pytest.mark.parametrize("ours", [True, False])
def test_the_cli_keeps_openmp_as_the_user_set_it_and_the_app_sleeps_its_threads(monkeypatch, capsys, ours):
    """The explorer asks OpenMP for sleeping threads unless the user chose; CLI commands do not ask."""
    import explorer
    from explorer import launcher
    from explorer.app import ExplorerApp

    monkeypatch.setattr(explorer, "SET_OMP_WAIT_POLICY", ours)
    monkeypatch.setattr(ExplorerApp, "run", lambda self: None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE" if ours else "ACTIVE")
    assert launcher.main(["explore", sample("mlp.onnx")]) == 0
    assert launcher.main([sample("mlp.onnx")]) == 0
    assert os.environ["OMP_WAIT_POLICY"] == ("PASSIVE" if ours else "ACTIVE")
    assert launcher.main(["ops"]) == 0 and "Gemm" in capsys.readouterr().out
    assert os.environ.get("OMP_WAIT_POLICY") == (None if ours else "ACTIVE")


@pytest.mark.parametrize("name", ["mlp.onnx", "residual_fanout.onnx", "small_cnn.onnx"])
async def test_sample_models_run_and_step(name):
    app = make_app(sample(name))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        s = app.session
        assert s.spec is not None or s.y is None
        if s.spec is None:  # no Gradient node: pick the first output and every float initializer
            g = s.graph
            xs = [n for n, t in g.initializers.items() if t.data_type == TensorProto.FLOAT][:2]
            s.select(g.outputs[0], xs)
            app.selection_changed()
        await pilot.press("r")
        await settle(app, pilot)
        assert s.gradient is not None
        await pilot.press("s")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StepScreen)
        for x in s.spec.xs:
            np.testing.assert_allclose(screen.trace.grads[x], s.gradient.grads[x], rtol=1e-4, atol=1e-5)
