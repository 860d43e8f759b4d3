"""Feeds in the app: integer inputs default to zeros, bad feeds stay in the dialog with the CLI's
message, and the app computes the same gradient numbers as `onnxgrad grad` for the same selection."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.cli import main
from engine.errors import FeedError
from engine.gradient.feed_checks import check_feed
from explorer import messages as m
from explorer.app import make_app
from explorer.feeding import FeedSource
from explorer.screens.feed import FeedScreen
from explorer.state import open_session

from ..feed_models import int_input_model
from .conftest import SIZE, of_type, plain, sample, settle, started

AGREEMENT = [  # (model, y, xs, zs, seed): intermediates in xs and zs included
    ("spec_grad_wrt_h.onnx", "Y", "H,Z", "", 0),
    ("spec_conv_gemm.onnx", "Y", "H,W", "", 3),
    ("spec_conv_gemm.onnx", "Y", "Z", "H", 1),
    ("mlp.onnx", "loss", "W2,b2", "H1,T", 0),
    ("small_cnn.onnx", "logits", "fc_W", "X", 2),
]


@pytest.mark.parametrize("name,y,xs,zs,seed", AGREEMENT)
async def test_app_and_cli_give_the_same_gradient_numbers(tmp_path, capsys, name, y, xs, zs, seed):
    out = tmp_path / "cli.npz"
    argv = ["grad", sample(name), "--y", y, "--xs", xs, "--seed", str(seed), "--out", str(out)]
    assert main(argv + (["--zs", zs] if zs else [])) == 0
    notes = capsys.readouterr().err
    app = make_app(sample(name), seed=seed, select_from_gradient_node=False)
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.session.select(y, xs.split(","), zs.split(",") if zs else [])
        app.selection_changed()
        await pilot.press("r")
        await settle(app, pilot)
        result = app.session.gradient
        assert result is not None, [n.message for n in app._notifications]
        with np.load(out) as cli:
            assert sorted(cli.files) == sorted(xs.split(","))
            for x in cli.files:
                np.testing.assert_allclose(result.grads[x], cli[x], rtol=1e-5, atol=1e-6)
    for member in (xs + "," + zs).strip(",").split(","):
        if member in app.session.graph.producer:  # an intermediate: the CLI says where its value came from
            assert f"note: {member} not fed: using its forward value" in notes


async def test_integer_inputs_default_to_zeros_and_run(tmp_path):
    path = tmp_path / "int.onnx"
    onnx.save(int_input_model(), path)
    app = make_app(str(path))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        source, explicit = app.session.feed_source("idx")
        assert source.describe() == "zeros" and not explicit
        app.session.select("loss", ["X"], ["idx"])
        app.selection_changed()
        await pilot.press("r")
        await settle(app, pilot)
        assert not [n for n in app._notifications if n.severity == "error"]
        e = np.arange(15, dtype=np.float32).reshape(5, 3) / 10
        np.testing.assert_allclose(app.session.gradient.grads["X"], e[[0, 0]], rtol=1e-6)


@pytest.mark.parametrize("value", [np.zeros((3, 3), np.float32), np.ones((1, 1, 4, 4), np.int64)])
async def test_feed_dialog_refuses_a_wrong_file_with_the_cli_message(tmp_path, recorded, value):
    seen, hook = recorded
    np.save(tmp_path / "bad.npy", value)
    app = make_app()
    app.raise_errors = True
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await started(app, pilot)
        before = app.session.feed_values()["X"].copy()
        await pilot.press("f")  # the cursor starts on X
        assert isinstance(app.screen, FeedScreen)
        await pilot.press("ctrl+u", *str(tmp_path / "bad.npy"), "enter")
        await pilot.pause()
        assert isinstance(app.screen, FeedScreen)  # the dialog stays open with the reason
        with pytest.raises(FeedError) as want:
            check_feed(app.session.graph, "X", value)
        assert plain(app.screen.query_one("#feed-error")).strip() == str(want.value)
        await pilot.press("escape")
        await settle(app, pilot)
        assert not of_type(seen, m.FeedChanged) and "X" not in app.session.feeds
        np.testing.assert_array_equal(app.session.feed_values()["X"], before)
        await pilot.press("r")
        await settle(app, pilot)
        assert app.session.gradient is not None


def test_the_cli_prints_the_same_message_for_the_same_file(tmp_path, capsys):
    value = np.zeros((3, 3), np.float32)
    np.save(tmp_path / "bad.npy", value)
    code = main(["run", sample("spec_conv_gemm.onnx"), "--feed", f"X={tmp_path / 'bad.npy'}"])
    assert code == 2
    with pytest.raises(FeedError) as want:
        check_feed(engine.load(sample("spec_conv_gemm.onnx")).graph, "X", value)
    assert capsys.readouterr().err.strip() == f"onnxgrad: error: {want.value}"


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=5).map(tuple),
       dtype=st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.bool_, np.uint8]))
def test_any_file_fed_in_the_app_fits_or_gets_the_cli_message(tmp_path_factory, shape, dtype):
    session, _ = open_session()
    path = tmp_path_factory.mktemp("npy") / "v.npy"
    value = np.ones(shape, dtype)
    np.save(path, value)
    fits = shape == (1, 1, 4, 4) and np.dtype(dtype).kind == "f"
    try:
        session.set_feed("X", FeedSource("npy", path=str(path)))
    except FeedError as exc:
        assert not fits
        assert str(exc) == f"feed 'X': expected float32 [1, 1, 4, 4], got {np.dtype(dtype)} {list(shape)}"
        assert "X" not in session.feeds
    else:
        assert fits and session.feeds["X"].kind == "npy"
