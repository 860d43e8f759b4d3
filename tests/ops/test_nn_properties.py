"""NN ops' values and gradients against torch written directly (F.conv2d, F.layer_norm, ...), over
hypothesis-drawn shapes and attributes: semantics a fixed case list would sample too thinly."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.registry import require


def fn(op, opset=22):
    return require("", op, opset, op).fn


def assert_same_values_and_grads(y, want, inputs):
    """y == want, and so are their vector-Jacobian products with one random seed."""
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    for got, exp in zip(torch.autograd.grad(y, inputs, g), torch.autograd.grad(want, inputs, g)):
        torch.testing.assert_close(got, exp)


dims = st.integers(1, 4)


@settings(max_examples=25, deadline=None)
@given(st.lists(dims, min_size=0, max_size=2), dims, dims, dims, st.booleans(), st.booleans())
def test_matmul_broadcasting_values_and_grads(batch, m, k, n, vec_a, vec_b):
    torch.manual_seed(0)
    a = torch.randn(*([k] if vec_a else batch + [m, k]), dtype=torch.float64, requires_grad=True)
    b = torch.randn(*([k] if vec_b else batch[1:] + [k, n]), dtype=torch.float64, requires_grad=True)
    y = fn("MatMul")(a, b)
    want = torch.from_numpy(np.asarray(np.matmul(a.detach().numpy(), b.detach().numpy())))
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    ga, gb = torch.autograd.grad(y, (a, b), g)
    wa, wb = torch.autograd.grad(torch.matmul(a, b), (a, b), g)
    torch.testing.assert_close(ga, wa)
    torch.testing.assert_close(gb, wb)


@settings(max_examples=25, deadline=None)
@given(st.lists(dims, min_size=1, max_size=4), st.data())
def test_layer_norm_matches_torch(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    norm_shape = shape[axis % len(shape):]
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    s = torch.randn(*norm_shape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*norm_shape, dtype=torch.float64, requires_grad=True)
    y = fn("LayerNormalization")(x, s, b, axis=axis, epsilon=1e-3)
    assert_same_values_and_grads(y, F.layer_norm(x, norm_shape, s, b, eps=1e-3), (x, s, b))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(5, 8), st.integers(5, 8), st.integers(1, 3),
       st.integers(1, 2), st.integers(1, 2), st.integers(0, 1))
def test_conv2d_matches_torch(cin_per_group, group, h, w, k, stride, dil, pad):
    torch.manual_seed(2)
    x = torch.randn(2, cin_per_group * group, h, w, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(2 * group, cin_per_group, k, k, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2 * group, dtype=torch.float64, requires_grad=True)
    y = fn("Conv")(x, wt, bias, strides=[stride] * 2, dilations=[dil] * 2, pads=[pad] * 4, group=group)
    want = F.conv2d(x, wt, bias, stride=stride, padding=pad, dilation=dil, groups=group)
    assert_same_values_and_grads(y, want, (x, wt, bias))


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 8), st.integers(3, 8), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1),
       st.booleans(), st.booleans())
def test_pools_match_torch(h, w, k, stride, pad, ceil, include_pad):
    pad = min(pad, k // 2)
    torch.manual_seed(3)
    x = torch.randn(1, 2, h, w, dtype=torch.float64, requires_grad=True)
    kw = dict(kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4, ceil_mode=int(ceil))
    ya = fn("AveragePool")(x, count_include_pad=int(include_pad), **kw)
    wa = F.avg_pool2d(x, k, stride, pad, ceil_mode=ceil, count_include_pad=include_pad)
    ym = fn("MaxPool")(x, **kw)
    wm = F.max_pool2d(x, k, stride, pad, ceil_mode=ceil)
    torch.testing.assert_close(ya, wa)
    torch.testing.assert_close(ym, wm)
    ga, gm = torch.randn_like(ya), torch.randn_like(ym)
    torch.testing.assert_close(torch.autograd.grad(ya, x, ga)[0], torch.autograd.grad(wa, x, ga)[0])
    torch.testing.assert_close(torch.autograd.grad(ym, x, gm)[0], torch.autograd.grad(wm, x, gm)[0])


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.integers(2, 6), st.integers(2, 12), st.integers(2, 12),
       st.sampled_from(["nearest", "linear"]), st.booleans())
def test_resize_matches_torch_interpolate(h, w, oh, ow, mode, align):
    torch.manual_seed(4)
    x = torch.randn(1, 2, h, w, dtype=torch.float64, requires_grad=True)
    sizes = torch.tensor([1, 2, oh, ow])
    if mode == "nearest":
        ctm, tmode, kw = "asymmetric", "nearest", {}
        y = fn("Resize")(x, None, None, sizes, mode="nearest", coordinate_transformation_mode=ctm, nearest_mode="floor")
    else:
        ctm = "align_corners" if align else "pytorch_half_pixel"
        tmode, kw = "bilinear", dict(align_corners=align)
        y = fn("Resize")(x, None, None, sizes, mode="linear", coordinate_transformation_mode=ctm)
    want = F.interpolate(x, size=(oh, ow), mode=tmode, **kw)
    if mode == "linear" and not align and (oh == 1 or ow == 1):
        return
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(want, x, g)[0])
