"""The finite-difference core: batching strategies, difference quotients, verdicts, row independence."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.verify import fd, verdict
from engine.verify.batching import BatchEvaluator
from engine.verify.structure import independent_rows

F64 = torch.float64


def _batch(k=6, shape=(3, 4), seed=0):
    return torch.randn((k,) + shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _loop(fn, xb):
    return torch.stack([fn(x) for x in xb])


def test_native_batching_is_used_when_the_function_is_batch_polymorphic():
    w = torch.randn(4, 5, dtype=F64)
    fn = lambda x: torch.tanh(x @ w)  # noqa: E731
    ev = BatchEvaluator(fn)
    xb = _batch()
    torch.testing.assert_close(ev(xb), _loop(fn, xb), rtol=1e-12, atol=1e-12)
    assert ev.strategy == "native"


def test_an_op_mixing_the_leading_axis_falls_back_to_vmap_and_stays_right():
    fn = lambda x: torch.softmax(x, dim=0)  # positive axis: natively it would normalise over the batch  # noqa: E731
    ev = BatchEvaluator(fn)
    xb = _batch()
    torch.testing.assert_close(ev(xb), _loop(fn, xb))
    assert ev.strategy == "vmap"


def test_a_function_that_reads_python_floats_falls_back_to_a_loop():
    def fn(x):
        return x * float(x.sum().item())  # .item() cannot run under vmap, and natively sums the batch

    ev = BatchEvaluator(fn)
    xb = _batch()
    torch.testing.assert_close(ev(xb), _loop(fn, xb))
    assert ev.strategy == "loop"


@settings(max_examples=25, deadline=None)
@given(a=st.floats(-2, 2), b=st.floats(-1, 1), x0=st.floats(-2, 2), n=st.integers(1, 6))
def test_central_differences_match_the_derivative_of_smooth_functions(a, b, x0, n):
    """Against the derivative written by hand, to float64 accuracy, elements and directions alike."""
    x = torch.linspace(x0, x0 + 1, n, dtype=F64)
    dy = torch.linspace(-1, 1, n, dtype=F64) + 0.3
    fn = lambda t: torch.sin(a * t) * torch.exp(b * t)  # noqa: E731
    grad = dy * (a * torch.cos(a * x) + b * torch.sin(a * x)) * torch.exp(b * x)
    ev = BatchEvaluator(fn)
    obj = fd.Objective(ev, fn(x), dy)
    pert = fd.element_perturbations(x, torch.arange(n).reshape(-1, 1))
    m = fd.measure(obj, x, pert, torch.arange(n), 64, fd.Control())
    np.testing.assert_allclose(m.d1, grad.numpy(), rtol=1e-6, atol=1e-7)
    u = torch.tensor([[1.0, -1.0] * n], dtype=F64)[:, :n]
    m = fd.measure(obj, x, fd.direction_perturbations(x, u), torch.arange(1), 64, fd.Control())
    np.testing.assert_allclose(m.d1, [(grad * u[0]).sum().item()], rtol=1e-6, atol=1e-7)


def _judge(fn, x, analytic, dy=None):
    x = torch.as_tensor(x, dtype=F64)
    dy = torch.ones_like(x) if dy is None else dy
    obj = fd.Objective(BatchEvaluator(fn), fn(x), dy)
    pert = fd.element_perturbations(x, torch.arange(x.numel()).reshape(-1, 1))
    m = fd.measure(obj, x, pert, torch.arange(x.numel()), 64, fd.Control())
    a = np.asarray(analytic, dtype=np.float64)
    tol = verdict.tolerance(len(a), None, None, verdict.element_scale(a, m.d1))
    fd.refine(obj, x, pert, m, verdict.to_refine(a, m, tol), 64, fd.Control())
    return verdict.classify(a, m, tol)


def test_relu_and_abs_at_zero_are_inconclusive_with_the_one_sided_derivatives_named():
    v = _judge(torch.relu, [0.0, 1.0, -1.0], [0.0, 1.0, 0.0])
    assert list(v.status) == ["inconclusive", "pass", "pass"]
    assert "one-sided derivatives 0 (left) and 1 (right)" in v.reasons[0]
    v = _judge(torch.abs, [0.0, 2.0], [0.0, 1.0])  # central differences agree with 0, but there is no derivative
    assert list(v.status) == ["inconclusive", "pass"]


def test_a_kink_within_one_step_is_inconclusive_not_failed():
    h = fd.STEP
    v = _judge(torch.relu, [0.3 * h, -0.6 * h], [1.0, 0.0])
    assert list(v.status) == ["inconclusive", "inconclusive"]
    v = _judge(torch.floor, [2.0 - 0.2 * h], [0.0])  # a jump: the quotient is huge
    assert list(v.status) == ["inconclusive"]


def test_high_curvature_that_is_smooth_still_passes():
    fn = lambda t: torch.nn.functional.softplus(t, beta=1e4)  # noqa: E731
    x = torch.tensor([1e-5, -2e-5, 0.0], dtype=F64)
    v = _judge(fn, x, torch.sigmoid(1e4 * x).numpy())
    assert list(v.status) == ["pass", "pass", "pass"]


def test_a_wrong_value_fails_only_beyond_both_tolerances():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    right = (2 * x).numpy()
    v = _judge(lambda t: t * t, x, right * np.array([1.0, 1 + 5e-5, 1.01]))
    assert list(v.status) == ["pass", "pass", "fail"]  # 5e-5 is inside the default rtol of 1e-4
    assert v.ratio[2] > 1 and v.abs_err[2] == pytest.approx(0.06, rel=1e-6)
    v = _judge(lambda t: t * t, x, [np.nan, 4.0, 6.0])
    assert v.status[0] == "fail" and "nan" in v.reasons[0]


def test_rows_that_never_mix_are_detected_and_mixing_rows_are_not():
    x = torch.randn(4, 6, dtype=F64)
    w = torch.randn(6, 3, dtype=F64)
    rowwise = lambda t: torch.tanh(t @ w)  # noqa: E731
    assert independent_rows(BatchEvaluator(rowwise), x, rowwise(x), seed=0) == 4
    for mixing in (lambda t: torch.softmax(t @ w, dim=0), lambda t: torch.cumsum(t @ w, dim=0),
                   lambda t: t @ w - (t @ w).mean(0, keepdim=True), lambda t: torch.flip(t, [0]) @ w):
        assert independent_rows(BatchEvaluator(mixing), x, mixing(x), seed=0) == 1


def test_compressed_rows_give_the_same_numbers_as_one_element_at_a_time():
    x = torch.randn(4, 5, dtype=F64)
    w = torch.randn(5, 5, dtype=F64)
    fn = lambda t: torch.tanh(t @ w)  # noqa: E731
    dy = torch.randn(4, 5, dtype=F64)
    y0 = fn(x)
    ev = BatchEvaluator(fn)
    plain = fd.measure(fd.Objective(ev, y0, dy), x, fd.element_perturbations(x, torch.arange(20).reshape(-1, 1)),
                       torch.arange(20), 64, fd.Control())
    groups = torch.arange(20).reshape(4, 5).T.contiguous()
    packed = fd.measure(fd.Objective(ev, y0, dy, rows=4), x, fd.element_perturbations(x, groups),
                        torch.arange(5), 64, fd.Control())
    by_element = np.empty(20)
    by_element[groups.reshape(-1).numpy()] = packed.d1
    np.testing.assert_allclose(by_element, plain.d1, rtol=1e-8, atol=1e-9)
