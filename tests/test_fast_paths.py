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
