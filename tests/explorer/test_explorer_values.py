"""The inspector's forward values: one pass per (feeds, device, dtype), never a value of other settings.

The chain has more nodes than SMALL_MODEL, so cursor moves are debounced as on the big models;
values are checked against onnxruntime, which shares no code with the engine.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import engine
from explorer import messages as m
from explorer.app import make_app
from explorer.screens.feed import FeedScreen
from explorer.work import SMALL_MODEL, VALUES_DEBOUNCE_S
from tests.big_models import residual_chain

from .conftest import of_type, opened, plain, settle

BLOCKS = 80  # 321 nodes


def chain_app():
    app = make_app(model=engine.load(residual_chain(BLOCKS)), label="chain")
    app.raise_errors = True
    assert len(app.session.graph.nodes) > SMALL_MODEL
    return app


def onnxruntime_value(name: str, feeds: dict, blocks: int = BLOCKS) -> np.ndarray:
    proto = residual_chain(blocks)
    proto.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([name], {k: v.astype(np.float32) for k, v in feeds.items()})[0]


async def until(pilot, condition, timeout: float = 30.0) -> None:
    """Pause until `condition()` holds (a loaded machine can take a while to push a dialog)."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await pilot.pause(0.05)
    assert condition()


async def quiet(app, pilot) -> None:
    """Past the debounce, then every worker done."""
    await pilot.pause(VALUES_DEBOUNCE_S + 0.2)
    await settle(app, pilot)


def shown(app) -> str:
    return plain(app.query_one("#inspector-page"))


def stats_of(value) -> str:
    from explorer.summaries import array_stats

    return f"norm {array_stats(value)['norm']:.4g}"


def assert_shows_current_value(app, tensor: str) -> None:
    """The inspector shows `tensor` and either says its value is coming or shows the value at the
    session's feeds and dtype: never one left from other settings."""
    s = app.session
    value = s.values.get(tensor)
    assert f"▸ {tensor}" in shown(app)
    if value is None:
        assert "value: computing…" in shown(app)
    else:
        assert value.dtype == np.dtype(s.dtype)
        np.testing.assert_allclose(value, onnxruntime_value(tensor, s.feed_values()), rtol=1e-4, atol=1e-6)
        assert stats_of(value) in shown(app)


async def test_a_burst_of_moves_computes_once_and_shows_where_the_cursor_stopped(recorded):
    seen, hook = recorded
    app = chain_app()
    async with opened(app, hook) as pilot:
        await pilot.press(*["down"] * 15)
        node, tensor = app.cursor
        assert node is not None and tensor == app.session.graph.nodes[node].output[0]
        assert_shows_current_value(app, tensor)
        await quiet(app, pilot)
        ready = of_type(seen, m.ValuesReady)
        assert len(ready) == 1 and ready[0].everything  # one pass, however many keys
        assert app.session.values[tensor] is not None
        assert_shows_current_value(app, tensor)
        await pilot.press("down", "down")  # later moves find their value without another pass
        await pilot.pause()
        assert app.cursor[1] != tensor and app.cursor[1] in app.session.values
        assert_shows_current_value(app, app.cursor[1])
        await quiet(app, pilot)
        assert len(of_type(seen, m.ValuesReady)) == 1


async def test_a_dtype_or_feed_change_drops_the_values_and_computes_them_again(recorded):
    seen, hook = recorded
    app = chain_app()
    async with opened(app, hook) as pilot:
        await pilot.press(*["down"] * 9)
        node, tensor = app.cursor
        await quiet(app, pilot)
        before = app.session.values[tensor]
        await pilot.press("t")
        assert app.session.dtype == "float64"
        assert_shows_current_value(app, tensor)  # "computing…", not the float32 value
        await quiet(app, pilot)
        assert app.session.values[tensor].dtype == np.float64
        assert_shows_current_value(app, tensor)

        app.move_cursor(None, "input")
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, FeedScreen))
        await pilot.press("ctrl+u", *"ones", "enter")
        await until(pilot, lambda: "input" in app.session.feeds)
        assert app.session.feeds["input"].kind == "ones"
        app.move_cursor(node, tensor)
        await pilot.pause()
        assert_shows_current_value(app, tensor)
        await quiet(app, pilot)
        after = app.session.values[tensor]
        assert not np.allclose(after, before)  # the new feed reached it
        assert_shows_current_value(app, tensor)
        assert len(of_type(seen, m.ValuesReady)) == 3  # float32, float64, float64 with the new feed


async def test_a_new_selection_keeps_the_values():
    app = chain_app()
    async with opened(app) as pilot:
        await pilot.press(*["down"] * 5)
        await quiet(app, pilot)
        tensor = app.cursor[1]
        computed = dict(app.session.values)
        await pilot.press("y")
        assert app.session.y == tensor and app.session.values == computed
        assert_shows_current_value(app, tensor)


def test_past_the_budget_values_are_asked_one_tensor_at_a_time(monkeypatch):
    from explorer import state
    from explorer.state import Session

    def job_for(tensor):
        s = Session(engine.load(residual_chain(3)), "chain")
        return s, s.values_job([tensor])

    s, job = job_for("block2.out")
    assert job.names == ()  # one pass over everything
    values = job.run()
    assert set(values) >= {t for n in s.graph.nodes for t in n.output} | {"input", "mix"}
    monkeypatch.setattr(state, "VALUES_BUDGET", 0)
    s, job = job_for("block2.out")
    assert job.names == ("block2.out",)
    expected = onnxruntime_value("block2.out", s.feed_values(), blocks=3)
    np.testing.assert_allclose(job.run()["block2.out"], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(values["block2.out"], expected, rtol=1e-5, atol=1e-7)


def test_run_all_leaves_out_only_what_an_unknown_op_stops():
    from tests.feed_models import custom_op_model

    proto = custom_op_model()
    model = engine.load(proto)
    w = next(numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == "W")
    x = np.random.default_rng(0).standard_normal(model.graph.types["X"].shape).astype(np.float32)
    values = model.run_all({"X": x})
    assert not {"B", "Y", "C"} & set(values)  # behind com.example::MyCustomOp
    np.testing.assert_allclose(values["A"], np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(values["Z"], np.tanh(x) * w, rtol=1e-6)
    np.testing.assert_array_equal(values["X"], x)
