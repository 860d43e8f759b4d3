"""Feeds checked against the model (one line naming the tensor and what it expects), and the
defaults for tensors nobody fed, shared by Model.gradient, the CLI and the explorer."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.cli import main
from engine.errors import FeedError
from engine.gradient.feeds import check_feed, default_spec, defaults_for

from ..feed_models import int_input_model, matmul_model

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]


@pytest.fixture(scope="module")
def fixed():
    return engine.load(matmul_model(4))


@pytest.fixture(scope="module")
def symbolic():
    return engine.load(matmul_model("N"))


def _expected_ok(shape, dtype, batch) -> bool:
    return np.dtype(dtype).kind == "f" and len(shape) == 2 and shape[1] == 8 and (batch is None or shape[0] == batch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple), dtype=st.sampled_from(DTYPES),
       which=st.sampled_from(["fixed", "symbolic"]), call=st.sampled_from(["run", "gradient", "check"]))
def test_any_feed_runs_or_gets_the_one_line_message(fixed, symbolic, shape, dtype, which, call):
    model = fixed if which == "fixed" else symbolic
    value = np.ones(shape, dtype)
    want = "float32 [4, 8]" if which == "fixed" else "float32 [N, 8]"
    ok = _expected_ok(shape, dtype, 4 if which == "fixed" else None)
    try:
        if call == "run":
            out = model.run({"X": value})
            assert out["Y"].shape == (shape[0], 3)
        elif call == "gradient":
            model.gradient("Y", ["W"], ["X"], feeds={"X": value})
        else:
            check_feed(model.graph, "X", value)
    except FeedError as exc:
        assert not ok, exc
        got = f"got {np.dtype(dtype)} {list(shape)}"
        assert str(exc) == f"feed 'X': expected {want}, {got}"
    else:
        assert ok, f"{shape} {np.dtype(dtype)} was accepted for X {want}"


def test_torch_tensors_are_checked_too(fixed):
    import torch

    with pytest.raises(FeedError, match=r"feed 'X': expected float32 \[4, 8\], got int64 \[4, 8\]"):
        fixed.run({"X": torch.ones((4, 8), dtype=torch.int64)})


def test_integer_inputs_default_to_zeros_and_floats_to_seeded_random():
    g = engine.load(int_input_model()).graph
    assert default_spec(g, "idx", 5) == "zeros"
    assert default_spec(g, "X", 5) == "random:6"  # seed + 1 + its position among the inputs


def test_intermediate_member_takes_its_forward_value_from_the_other_defaults(spec_model):
    values, chosen = defaults_for(spec_model, ["H", "Z"], {}, seed=3)
    assert [d.note for d in chosen] == ["X not fed: using random:4", "H not fed: using its forward value"]
    x = np.random.default_rng(4).standard_normal((1, 1, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(values["H"], spec_model.run({"X": x}, outputs=["H"])["H"])
    np.testing.assert_array_equal(values["Z"], spec_model.constants()["Z"].numpy())
    result = spec_model.gradient("Y", ["H", "Z"], seed=3)
    np.testing.assert_array_equal(result.values["H"], values["H"])


def test_cli_run_defaults_integer_inputs_to_zeros_and_says_so(tmp_path, capsys):
    import onnx

    path = tmp_path / "int.onnx"
    onnx.save(int_input_model(), path)
    assert main(["run", str(path), "--out", str(tmp_path / "o.npz")]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "note: X not fed: using random:1",
        "note: idx not fed: using zeros (the integer default; random draws indices over [0, 5))"]
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    e = np.arange(15, dtype=np.float32).reshape(5, 3) / 10
    with np.load(tmp_path / "o.npz") as data:
        np.testing.assert_allclose(data["loss"], (e[[0, 0]] * x).sum(), rtol=1e-6)


@pytest.mark.parametrize("value", [np.zeros((3, 3), np.float32), np.zeros((1, 1, 4, 4), np.int64)])
def test_cli_refuses_a_wrong_feed_file_with_the_engine_message(spec_path, tmp_path, capsys, value):
    np.save(tmp_path / "bad.npy", value)
    code = main(["grad", str(spec_path), "--y", "Y", "--xs", "W", "--zs", "X", "--feed", f"X={tmp_path / 'bad.npy'}"])
    err = capsys.readouterr().err
    assert code == 2
    with pytest.raises(FeedError) as want:
        check_feed(engine.load(str(spec_path)).graph, "X", value)
    assert err.strip() == f"onnxgrad: error: {want.value}"
    assert "expected float32 [1, 1, 4, 4]" in err


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    import onnx

    from engine import examples

    path = tmp_path_factory.mktemp("m") / "spec.onnx"
    onnx.save(examples.spec_conv_gemm(), path)
    return path


@pytest.fixture
def spec_model():
    from engine import examples

    return engine.load(examples.spec_conv_gemm())


def test_a_random_float32_feed_is_drawn_without_a_float64_copy_of_it():
    """The same numbers as the whole float64 draw cast, at a peak of the result and one block."""
    import tracemalloc

    from engine.gradient import feeds

    shape = (3, feeds.DRAW_BLOCK + 5)
    want = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    tracemalloc.start()
    try:
        got = feeds.standard_normal(7, shape, np.float32)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and peak < got.nbytes + 8 * feeds.DRAW_BLOCK + (1 << 20), peak
    np.testing.assert_array_equal(feeds.standard_normal(7, (4, 5), np.float64),
                                  np.random.default_rng(7).standard_normal((4, 5)))
    assert feeds.standard_normal(1, (), np.float16).shape == ()
