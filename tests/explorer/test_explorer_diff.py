"""Diff mode in the explorer (issue 34): `b` compares the model with a changed copy, float16 or
onnxruntime; the graph and the navigator colour nodes by divergence, `n` goes to the culprit, the
inspector shows both sides' values and a histogram of their differences; leaving restores the view.

The oracle for the changed copy is its construction (only W2 is scaled, and only fc2 reads it) and
onnxruntime, which runs both files on the session's feeds for the values the inspector shows."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from explorer import messages as m
from explorer.app import make_app
from explorer.screens.diff import DiffScreen

from .conftest import SIZE, of_type, plain, sample, settle, started

MLP = sample("mlp.onnx")


def _scaled_copy(tmp_path, weight: str = "W2", factor: float = 1.01) -> str:
    model = onnx.load(MLP)
    for w in model.graph.initializer:
        if w.name == weight:
            w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * factor, weight))
    path = str(tmp_path / "mlp_w2.onnx")
    onnx.save(model, path)
    return path


def _mlp_app(placement: str = "auto"):
    app = make_app(MLP, placement=placement)
    app.raise_errors = True
    app.session.select("loss", ["W1"], ["X", "T"])
    return app


async def _diff_with(app, pilot, path: str) -> None:
    await pilot.press("b")
    assert isinstance(app.screen, DiffScreen)
    app.screen.query_one("#diff-path").value = path
    await pilot.press("enter")
    await settle(app, pilot)


def _readers(path: str, weight: str) -> list[str]:
    return [n.name for n in onnx.load(path).graph.node if weight in n.input]


def _node_box(app, name: str) -> str:
    return app.query_one("#graph").ids_for(app.session.graph.node_names.index(name))[0]


async def test_a_scaled_weight_colours_its_reader_and_n_goes_there(tmp_path, recorded):
    seen, hook = recorded
    b_path = _scaled_copy(tmp_path)
    app = _mlp_app()
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, b_path)
        [ready] = of_type(seen, m.DiffReady)
        assert ready.report.first_divergence.node == "fc2" == _readers(MLP, "W2")[0]
        g, s = app.session.graph, app.session
        fc2, fc1 = g.node_names.index("fc2"), g.node_names.index("fc1")
        marks = app.query_one("#node-list").query_one("EntryList").marks
        assert marks[fc2] == "fail" and marks[fc1] == "pass"  # upstream of W2 nothing differs
        # downstream nodes carry fc2's difference without adding to it
        assert {marks[g.node_names.index(n)] for n in ("log_softmax", "pick")} == {"inconclusive"}
        graph = app.query_one("#graph")
        assert graph.marks[_node_box(app, "fc2")] == "fail" and graph.marks[_node_box(app, "fc1")] == "pass"
        assert "diff vs mlp_w2.onnx" in plain(app.query_one("#selection-bar"))
        # the Diff tab lists the nodes worst first: fc2 heads it, and enter on a row goes to its node
        table = app.query_one("#diff-table")
        assert app.query_one("#results-tabs").active == "tab-diff" and table.get_row_at(0)[0] == "fc2"
        assert table.row_count == len([r for r in ready.report.nodes if r.where == "forward"])
        app.move_cursor(fc1, None)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.cursor[0] == g.node_names.index(table.get_row_at(1)[0])
        app.query_one("#graph").focus()
        app.move_cursor(fc1, None)
        await pilot.press("n")
        await settle(app, pilot)
        assert app.cursor[0] == fc2
        # the gradient view: fc2 diverges there too (its W2 scales the gradient it sends to A1)
        await pilot.press("B")
        await settle(app, pilot)
        assert s.diff.where == "gradient" and graph.marks[_node_box(app, "fc2")] == "fail"
        assert app.query_one("#node-list").query_one("EntryList").marks[fc2] == "fail"


async def test_the_inspector_shows_both_values_and_a_histogram_of_their_differences(tmp_path):
    b_path = _scaled_copy(tmp_path)
    app = _mlp_app()
    async with app.run_test(size=(160, 60)) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, b_path)
        feeds = app.session.feed_values()
        a, b = (ort.InferenceSession(p).run(["logits"], feeds)[0] for p in (MLP, b_path))
        app.move_cursor(app.session.graph.node_names.index("fc2"), "logits")
        await settle(app, pilot)
        text = plain(app.query_one("#inspector-page"))
        assert "diverges by itself" in text and "tolerance" in text and "W2" in text
        assert f"{a.max():.4g}" in text and f"{b.max():.4g}" in text  # A's and B's max side by side
        worst = np.abs(a.astype(np.float64) - b).max()
        assert f"{worst:.4g}" in text
        assert f"|a−b| {a.size} elements" in text
        decade = int(np.floor(np.log10(worst)))
        assert f"≥ 1e{decade:+03d}" in text  # the worst difference lies in the histogram's top decade


async def test_float16_on_the_transformer_block_shows_no_divergence():
    app = make_app(sample("transformer_block.onnx"))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("b")
        await pilot.click("#diff-float16")
        await settle(app, pilot)
        diff = app.session.diff
        assert diff is not None and diff.report.mode == "dtype" and not diff.report.diverges
        marks = app.query_one("#node-list").query_one("EntryList").marks
        assert marks and "fail" not in marks.values()
        assert "fail" not in app.query_one("#graph").marks.values()
        assert "no divergence" in plain(app.query_one("#selection-bar"))
        assert not app.check_action("go_to_culprit", ())  # nothing for n to go to


async def test_a_bad_b_path_is_a_notification_not_a_traceback(tmp_path):
    app = _mlp_app()
    app.raise_errors = False  # a failed worker is reported by the app itself, as the user sees it
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, str(tmp_path / "missing.onnx"))
        errors = [n for n in app._notifications if n.severity == "error"]
        assert len(errors) == 1 and "missing.onnx" in errors[0].message and "\n" not in errors[0].message
        assert app.session.diff is None and not app.query_one("#node-list").query_one("EntryList").marks
        (tmp_path / "junk.onnx").write_bytes(b"not a model")
        await _diff_with(app, pilot, str(tmp_path / "junk.onnx"))
        assert len([n for n in app._notifications if n.severity == "error"]) == 2
        assert app.session.diff is None


async def test_an_empty_path_is_answered_in_the_dialog_and_leaving_restores_the_view(tmp_path):
    b_path = _scaled_copy(tmp_path)
    app = _mlp_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        graph = app.query_one("#graph")
        before = dict(graph.marks)
        await _diff_with(app, pilot, "")
        assert isinstance(app.screen, DiffScreen) and "give B's path" in str(app.screen.query_one("#diff-error").content)
        app.screen.query_one("#diff-path").value = b_path
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.session.diff is not None and graph.marks != before
        await pilot.press("b")
        await pilot.click("#diff-leave")
        await settle(app, pilot)
        assert app.session.diff is None and graph.marks == before
        assert not app.query_one("#node-list").query_one("EntryList").marks
        assert app.query_one("#results-tabs").active != "tab-diff"
        assert "diff" not in plain(app.query_one("#selection-bar"))
        assert not app.check_action("diff", ("where",))


async def test_a_diff_made_before_the_feeds_changed_says_it_is_stale_and_b_enter_compares_again(tmp_path):
    from explorer.feeding import FeedSource

    app = _mlp_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, _scaled_copy(tmp_path))
        first = app.session.diff
        await pilot.press("t")  # float64 for the app's own runs: a diff runs A in its own dtype, still current
        await settle(app, pilot)
        assert app.session.dtype == "float64" and "stale" not in plain(app.query_one("#selection-bar"))
        app.session.set_feed("X", FeedSource("ones"))
        app.selection_changed()
        await settle(app, pilot)
        assert "stale" in plain(app.query_one("#selection-bar")) and "stale" in plain(app.query_one("#inspector-page"))
        await pilot.press("b")
        assert app.screen.focused.id == "diff-again"
        await pilot.press("enter")
        await settle(app, pilot)
        again = app.session.diff
        assert again is not first and again.choice == first.choice and not again.stale(app.session)
        assert "stale" not in plain(app.query_one("#selection-bar"))
        # the new report ran on the new feeds: A's logits from X = ones, as onnxruntime computes them
        a = ort.InferenceSession(MLP).run(["logits"], app.session.feed_values())[0]
        np.testing.assert_allclose(again.report.values.forward["logits"][0], a, rtol=1e-5, atol=1e-6)


async def test_opening_another_model_leaves_diff_mode(tmp_path):
    app = _mlp_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, _scaled_copy(tmp_path))
        assert app.query_one("#node-list").query_one("EntryList").marks
        app.run_open(sample("small_cnn.onnx"))
        await started(app, pilot)
        assert app.session.label == "small_cnn.onnx" and app.session.diff is None
        assert not app.query_one("#node-list").query_one("EntryList").marks  # node indices of another graph
        assert "fail" not in app.query_one("#graph").marks.values()
        assert app.query_one("#results-tabs").active != "tab-diff"


def test_every_diff_action_is_in_the_palette_and_the_keys_have_ids():
    from explorer.app import ExplorerApp
    from explorer.commands import COMMANDS

    actions = {a for _, _, a in COMMANDS}
    assert {"diff"} | {f"diff('{w}')" for w in ("where", "leave", "float16", "bfloat16", "onnxruntime")} <= actions
    keys = {b.id: b for b in ExplorerApp.BINDINGS}
    assert (keys["diff.open"].key, keys["diff.open"].action) == ("b", "diff")
    assert (keys["diff.where"].key, keys["diff.where"].action) == ("B", "diff('where')")
    assert all(b.id and b.description for b in DiffScreen.BINDINGS)


def test_diff_view_snapshot(snap_compare, tmp_path):
    b_path = _scaled_copy(tmp_path)

    async def diffed(pilot):
        app = pilot.app
        await started(app, pilot)
        await _diff_with(app, pilot, b_path)
        app.clear_notifications()
        # Where the graph scrolled to reveal the culprit depends on when the layout settled (under a
        # loaded CPU it may centre it): from the top, the whole slice down to fc2 shows at 120x40.
        app.query_one("#graph").scroll_to(0, 0, animate=False, immediate=True)
        await settle(app, pilot)

    assert snap_compare(_mlp_app(placement="layered"), terminal_size=SIZE, run_before=diffed)


async def test_escape_cancels_a_running_diff_and_its_late_report_is_dropped(monkeypatch):
    import threading

    from explorer import diff_state

    release, running = threading.Event(), threading.Event()
    real_run = diff_state.DiffJob.run

    def slow_run(job):
        running.set()
        release.wait(10)
        return real_run(job)

    monkeypatch.setattr(diff_state.DiffJob, "run", slow_run)
    app = _mlp_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("b")
        await pilot.click("#diff-float16")
        for _ in range(200):
            if running.is_set():
                break
            await pilot.pause(0.01)
        assert app.check_action("cancel", ())  # esc is offered while the diff runs
        await pilot.press("escape")
        release.set()
        await settle(app, pilot)
        assert app.session.diff is None and not app.query_one("#node-list").query_one("EntryList").marks
        assert "cancelled: comparing models" in str(app.query_one("#status-text").content)


async def test_b_on_a_forward_only_diff_says_how_to_compare_gradients(tmp_path):
    app = make_app(MLP)
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await _diff_with(app, pilot, _scaled_copy(tmp_path))
        diff = app.session.diff
        assert diff is not None and not diff.has_gradient and diff.where == "forward"
        await pilot.press("B")
        assert diff.where == "forward"
        assert any("forward only: select y and xs" in n.message for n in app._notifications)


def test_the_histogram_counts_each_difference_in_its_decade():
    from explorer.widgets.diff_view import histogram_of_differences

    b = np.array([0, 0, 2e-6, 3e-6, 5e-5, 0.5, 0.7, 7, np.inf, np.nan])
    text = histogram_of_differences(np.zeros(10), b).plain
    rows = {line.split()[0] + " " + line.split()[1] if line.split()[0] in "≥<=" else line.split()[0]: line.split()[-1]
            for line in text.splitlines()[1:] if line.strip()}
    assert rows == {"= 0": "2", "≥ 1e-06": "2", "≥ 1e-05": "1", "≥ 1e-04": "0", "≥ 1e-03": "0", "≥ 1e-02": "0",
                    "≥ 1e-01": "2", "≥ 1e+00": "1", "NaN/Inf": "2"}
    assert "10 elements" in text.splitlines()[0]


def test_n_in_diff_mode_without_an_app_goes_to_the_culprit_and_turns_the_colours_to_its_direction():
    import engine
    from engine.modeldiff.report import Divergence, NodeDiff
    from explorer.app import ExplorerApp
    from explorer.debugging import Debugging
    from explorer.diff_state import DiffChoice, DiffShown
    from explorer.diffing import DiffingApp
    from explorer.host import Shown
    from explorer.keys import Keys
    from explorer.state import Session
    from tests.explorer.test_collaborators import FakeApp

    provided = set(dir(make_app()))
    asked = {n for c in DiffingApp.__mro__ if c.__module__.startswith("explorer.")
             for n in (*vars(c).get("__annotations__", {}), *(k for k, v in vars(c).items() if callable(v)))
             if not n.startswith("__")}
    assert asked and asked <= provided, sorted(asked - provided)

    model = engine.load(MLP)
    rows = (NodeDiff("fc2", "Gemm", "forward", 2, ("fc2",), ("logits",), 0.01, 0.01, 1e-6, True),
            NodeDiff("fc2", "Gemm", "gradient", 4, ("fc2",), ("logits",), 1e-7, 1e-7, 1e-6))
    report = engine.DiffReport("a", "b", "models", nodes=rows,
                               culprits=(Divergence("fc2", "forward", 0.01, 1e-6, "Gemm"),))
    s = Session(model, "mlp.onnx")
    shown, app, turned = Shown(s, (0, "H1")), FakeApp(), []

    class Colours:
        def show_where(self, where):
            s.diff.where = where
            turned.append(where)

    debugging = Debugging(shown, app, Colours())
    keys = Keys(shown, app, ExplorerApp.BINDINGS, lambda: False, debugging.culprit)
    assert not keys.applies("diff", ("where",)) and not keys.applies("go_to_culprit")
    s.diff = DiffShown.of(report, DiffChoice(b="b.onnx"))
    s.diff.where = "gradient"  # nothing diverges there: n goes to the forward culprit and shows the forward
    assert keys.applies("diff", ("where",)) and keys.applies("go_to_culprit") and keys.applies("diff", ("float16",))
    assert s.diff.node_marks(model.graph) == {model.graph.node_names.index("fc2"): "pass"}
    debugging.go_to_culprit()
    assert app.moves == [(model.graph.node_names.index("fc2"), "logits")] and turned == ["forward"]
    assert s.diff.node_marks(model.graph) == {model.graph.node_names.index("fc2"): "fail"}
