"""The fused torch kernels some ops take for speed agree with the ops' general formulas."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ops import nn, pool
from engine.ops.pool import _geometry, _lowest, _padded, _windows


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.data())
def test_max_pool_fast_path_matches_windows(nd, data):
    k = data.draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    s = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    d = data.draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    p = data.draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd))
    size = data.draw(st.lists(st.integers(5, 9), min_size=nd, max_size=nd))
    ceil = data.draw(st.integers(0, 1))
    x = torch.randn(2, 3, *size, dtype=torch.float64, generator=torch.Generator().manual_seed(nd), requires_grad=True)
    try:
        kernel, strides, dil, begin, end, outs, extra = _geometry("MaxPool", x, "NOTSET", ceil, k, s, d, p + p)
    except Exception:
        return
    if min(outs) <= 0:
        return
    fast = pool._torch_max_pool(x, kernel, strides, dil, begin, outs, ceil)
    if fast is None:
        return
    slow = _windows(_padded(x, begin, end, extra, _lowest(x.dtype)), 2, kernel, strides, dil).max(dim=-1).values
    assert torch.equal(fast, slow)
    (g_fast,), (g_slow,) = torch.autograd.grad(fast.sum(), x), torch.autograd.grad(slow.sum(), x)
    assert torch.equal(g_fast, g_slow)


def test_batch_norm_fused_path_matches_formula_and_keeps_stat_gradients():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, generator=g, requires_grad=True)
    scale, b, mean = (torch.randn(3, dtype=torch.float64, generator=g) for _ in range(3))
    var = torch.rand(3, dtype=torch.float64, generator=g) + 0.5
    fused = nn.batch_norm(x, scale, b, mean, var)
    formula = nn._channel(scale, 4) * (x - nn._channel(mean, 4)) / torch.sqrt(nn._channel(var, 4) + 1e-5) + nn._channel(b, 4)
    torch.testing.assert_close(fused, formula, rtol=1e-12, atol=1e-12)
    # A mean that wants a gradient must not go through F.batch_norm, which treats it as constant.
    m = mean.clone().requires_grad_()
    (gm,) = torch.autograd.grad(nn.batch_norm(x, scale, b, m, var).sum(), m)
    torch.testing.assert_close(gm, -scale / torch.sqrt(var + 1e-5) * 4 * 25)


def test_layer_norm_fused_path_matches_formula():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, dtype=torch.float64, generator=g)
    scale, b = torch.randn(6, dtype=torch.float64, generator=g), torch.randn(6, dtype=torch.float64, generator=g)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    torch.testing.assert_close(nn.layer_norm(x, scale, b), (x - mean) / torch.sqrt(var + 1e-5) * scale + b)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=4), st.lists(st.integers(-1, 3), max_size=4))
def test_expand_broadcast_agrees_with_torch(a, b):
    from engine.ops.shape import broadcast

    try:
        want = list(torch.broadcast_shapes(tuple(a), tuple(b)))
    except (RuntimeError, ValueError):
        want = None
    assert broadcast(a, b) == want


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2.0, 3.0, 0.5, -1.0, -0.5, 0.0, 1.7]), st.sampled_from([(), (1,)]))
def test_pow_constant_exponent_is_torch_eager_pow(e, shape):
    """A one-element constant exponent runs as x.pow(number): values and gradients are eager's
    (x.pow(2) is what Llama's RMSNorm computes), and a tensor exponent that is differentiated
    keeps its own gradient."""
    from engine.ops.elementwise import pow_

    x = torch.rand(3, 5, generator=torch.Generator().manual_seed(1)) + 0.1
    x.requires_grad_()
    got = pow_(x, torch.tensor(e).reshape(shape))
    want = x.pow(torch.tensor(e).item())  # the float32 constant's value, as an exported model holds it
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])
    y = torch.tensor(e, requires_grad=True)
    (gy,) = torch.autograd.grad(pow_(x, y).sum(), y)
    assert torch.allclose(gy, (x.pow(e) * x.log()).sum())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=3, max_size=4), st.integers(1, 5), st.data())
def test_matmul_of_a_permuted_activation_matches_numpy_with_its_gradients(shape, n, data):
    """MatMul folds a non-contiguous N-D `a` into one mm (a copy) instead of torch's per-batch bmm."""
    import numpy as np

    perm = data.draw(st.permutations(range(len(shape) - 1))) + [len(shape) - 1]
    g = torch.Generator().manual_seed(len(shape) * 10 + n)
    base = torch.randn(*shape, dtype=torch.float64, generator=g)
    a = base.permute(*perm).detach().requires_grad_()  # a leaf that keeps the permuted strides
    b = torch.randn(shape[-1], n, dtype=torch.float64, generator=g, requires_grad=True)
    y = nn.matmul(a, b)
    torch.testing.assert_close(y, torch.from_numpy(np.matmul(a.detach().numpy(), b.detach().numpy())))
    up = torch.randn(y.shape, dtype=torch.float64, generator=g)
    ga, gb = torch.autograd.grad(y, (a, b), up)
    torch.testing.assert_close(ga, torch.from_numpy(np.matmul(up.numpy(), b.detach().numpy().T)))
    flat_a, flat_up = a.detach().reshape(-1, shape[-1]).numpy(), up.reshape(-1, n).numpy()
    torch.testing.assert_close(gb, torch.from_numpy(flat_a.T @ flat_up))


def test_matmul_of_a_transposed_activation_runs_one_mm_not_a_bmm():
    """The exported batch_first attention's input projection: x (batch, seq, d) transposed to (seq, batch, d)."""
    x = torch.randn(4, 32, 16, requires_grad=True)
    w = torch.randn(16, 48)
    with torch.autograd.profiler.profile() as prof:
        torch.autograd.grad(nn.matmul(x.transpose(0, 1), w).sum(), x)
    ops = [e.name for e in prof.function_events]
    assert "aten::bmm" not in ops and ops.count("aten::mm") == 2  # forward, and the backward for x
