"""Model.gradient's per-call path (engine/gradient/call.py): a numpy feed of exactly the declared
type takes the quick path, anything else the general one; both give torch's own gradient, refuse a
bad feed with check_feed's one-line message whatever the calls before it, and hand back values
that cannot be written (a feed of the declared type is used in place, other arrays copied)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.errors import FeedError
from engine.gradient.feed_checks import check_feed

from ..feed_models import TANH_W, tanh_matmul_model


def oracle(x: np.ndarray) -> tuple[float, np.ndarray]:
    """loss and dloss/dX by torch in float64, written directly."""
    leaf = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    loss = torch.tanh(leaf @ torch.tensor(TANH_W, dtype=torch.float64)).sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    return float(loss.detach()), grad.numpy()


@pytest.fixture(scope="module")
def fixed():
    return engine.load(tanh_matmul_model(2))


@pytest.fixture(scope="module")
def symbolic():
    return engine.load(tanh_matmul_model("batch"))


def assert_matches_oracle(result, x):
    loss, grad = oracle(x)
    # float32 against float64: the loss is a sum of tanh terms that can cancel to near 0
    np.testing.assert_allclose(result.y, loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.grads["X"], grad, rtol=1e-5, atol=1e-6)


VALUES = st.sampled_from([
    np.float32, np.float64, np.float16, np.int64, "fortran", "strided", "list", "tensor"])


def make_value(kind, shape, rng):
    x = rng.standard_normal(shape)
    if kind == "fortran":
        return np.asfortranarray(x.astype(np.float32))
    if kind == "strided":
        return np.repeat(x.astype(np.float32), 2, axis=-1)[..., ::2]
    if kind == "list":
        return x.astype(np.float32).tolist()
    if kind == "tensor":
        return torch.tensor(x, dtype=torch.float32)
    return (x * 3).astype(kind)


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(VALUES, min_size=1, max_size=5),
       shapes=st.lists(st.sampled_from([(2, 3), (5, 3), (2, 4), (3,), (1, 2, 3)]), min_size=5, max_size=5),
       seed=st.integers(0, 2**16))
def test_a_sequence_of_calls_gives_torch_gradients_or_check_feeds_error(fixed, symbolic, kinds, shapes, seed):
    rng = np.random.default_rng(seed)
    for model in (fixed, symbolic):
        for kind, shape in zip(kinds, shapes):
            value = make_value(kind, shape, rng)
            probe = value if isinstance(value, torch.Tensor) else np.asarray(value)
            try:
                check_feed(model.graph, "X", probe)
            except FeedError as refused:
                with pytest.raises(FeedError) as got:
                    model.gradient("loss", ["X"], feeds={"X": value})
                assert str(got.value) == str(refused)
                continue
            result = model.gradient("loss", ["X"], feeds={"X": value})
            assert_matches_oracle(result, probe.numpy() if isinstance(probe, torch.Tensor) else probe)
            np.testing.assert_array_equal(result.values["X"], np.asarray(probe, np.float32))


def test_a_feed_of_the_declared_type_is_used_in_place_and_shown_read_only(fixed):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    result = fixed.gradient("loss", ["X"], feeds={"X": x})
    assert_matches_oracle(result, x)
    assert np.shares_memory(result.values["X"], x)  # no copy per call
    with pytest.raises(ValueError, match="read-only"):
        result.values["X"][0, 0] = 1.0
    x *= 3  # the caller reuses its buffer for the next batch: the next call sees the new values
    assert_matches_oracle(fixed.gradient("loss", ["X"], feeds={"X": x}), x)


@pytest.mark.parametrize("make", [np.asfortranarray, lambda a: a[:, ::-1], "read-only"])
def test_an_array_torch_cannot_wrap_as_it_is_is_copied(fixed, make):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    if make == "read-only":
        x.flags.writeable = False  # e.g. a result's values fed back: from_numpy would warn
        fed = x
    else:
        fed = make(x.copy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = fixed.gradient("loss", ["X"], feeds={"X": fed})
    assert_matches_oracle(result, fed)
    assert not np.shares_memory(result.values["X"], fed) and not result.values["X"].flags.writeable


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_a_computation_dtype_converts_the_quick_feed_and_the_results(fixed, dtype):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    result = fixed.gradient("loss", ["X"], feeds={"X": x}, dtype=dtype)
    assert result.dtype == dtype
    assert not result.values["X"].flags.writeable
    loss, grad = oracle(x)
    tol = {"float64": 1e-12, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
    np.testing.assert_allclose(result.y, loss, rtol=tol)
    np.testing.assert_allclose(result.grads["X"], grad, rtol=tol, atol=tol)
    # numpy has no bfloat16: its values and results come back as float32, as to_numpy makes them
    assert result.grads["X"].dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))


def test_a_result_kept_across_later_calls_keeps_its_own_numbers(fixed):
    # y and the gradients are numpy views of the call's own torch tensors: a later call must not
    # write into them (the result outlives the call, and a loop of calls keeps earlier results).
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
    results = [fixed.gradient("loss", ["X"], feeds={"X": x}) for x in xs]
    for result, x in zip(results, xs):
        assert_matches_oracle(result, x)
        assert np.shares_memory(result.values["X"], x)
        assert not np.shares_memory(result.grads["X"], x)


def test_a_result_is_the_dataclass_with_every_field(fixed):
    import dataclasses
    result = fixed.gradient("loss", ["X"], feeds={"X": np.ones((2, 3), np.float32)})
    assert set(vars(result)) == {f.name for f in dataclasses.fields(result)}
    assert dataclasses.replace(result) == result  # the same as the dataclass's own __init__ makes
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.y = None
