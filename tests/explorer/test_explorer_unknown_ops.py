"""The explorer on a model with an unknown op: it opens, marks the node, says so once, runs every
selection that avoids the op, and explains in one line a selection that reaches it."""
from __future__ import annotations

import numpy as np

from explorer import messages as m
from explorer.app import make_app
from explorer.widgets.node_list import UNSUPPORTED, NodeList

from .conftest import SIZE, of_type, plain, settle, started


async def _run(app, pilot, y, xs):
    app.session.select(y, xs)
    app.selection_changed()
    await pilot.press("r")
    await settle(app, pilot)


async def test_the_app_opens_marks_the_node_and_runs_around_it(custom_op_path, recorded):
    seen, hook = recorded
    app = make_app(custom_op_path)
    app.raise_errors = True
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        warnings = [n for n in app._notifications if n.title == "unsupported ops"]
        assert len(warnings) == 1 and "com.example::MyCustomOp (custom)" in warnings[0].message
        custom = app.session.graph.node_names.index("custom")
        entry = next(e for e in app.query_one(NodeList).entries if e.node_index == custom)
        assert entry.detail == f"MyCustomOp {UNSUPPORTED}"
        graph = app.query_one("#graph")
        box = graph.ids_for(node_index=custom)[0]
        assert graph.marks[box] == "unsupported"
        app.move_cursor(custom, None)  # its output B has no value: said in the inspector, no error toast
        await settle(app, pilot)
        info = plain(app.query_one("#inspector-page"))
        assert "unsupported: onnxgrad has no implementation" in info
        assert "no value: it needs custom, an op onnxgrad cannot run" in info
        assert not [n for n in app._notifications if n.severity == "error"]
        assert [graph.marks.get(b) for b in graph.ids_for(node_index=0)] != ["unsupported"]

        await _run(app, pilot, "Z", ["A"])
        want = app.session.model.gradient("Z", ["A"], feeds=app.session.feed_values())
        np.testing.assert_allclose(app.session.gradient.grads["A"], want.grads["A"], rtol=1e-6)

        await _run(app, pilot, "Y", ["A"])
        assert app.session.gradient is None
        failed = of_type(seen, m.WorkFinished)[-1]
        assert failed.kind == "gradient" and failed.outcome == "failed"
        assert failed.detail.startswith("node 'custom': op com.example::MyCustomOp")
        assert len(failed.detail.splitlines()) == 1 and len(failed.detail) < 300


async def test_ops_files_register_the_op_before_the_model_opens(custom_op_path, ops_file):
    app = make_app(custom_op_path, ops=(ops_file,))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert not [n for n in app._notifications if n.title == "unsupported ops"]
        await _run(app, pilot, "Y", ["A"])
        a = np.tanh(app.session.feed_values()["X"].astype(np.float64))
        np.testing.assert_allclose(app.session.gradient.grads["A"], 2 * a + np.cos(a) + 1, rtol=1e-5)


async def test_a_bad_ops_file_is_explained_in_the_app(tmp_path, custom_op_path):
    bad = tmp_path / "bad_ops.py"
    bad.write_text("raise RuntimeError('no torch here')\n")
    app = make_app(custom_op_path, ops=(str(bad),))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.session is None
        texts = [n.message for n in app._notifications]
        assert texts == [f"--ops {bad}: RuntimeError on line 1: no torch here"]
