"""Shape ops' values and gradients against torch and numpy written directly (gather, expand, slice,
pad, concat/transpose, scatter), over hypothesis-drawn shapes and indices."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.registry import require


def fn(op, opset=25):
    return require("", op, opset, op).fn


def _same_grads(ours, theirs, *args):
    args1 = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    args2 = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    y1, y2 = ours(*args1), theirs(*args2)
    torch.testing.assert_close(y1, y2)
    w = torch.randn_like(y1)
    g1 = torch.autograd.grad((y1 * w).sum(), [a for a in args1 if a.requires_grad], allow_unused=True)
    g2 = torch.autograd.grad((y2 * w).sum(), [a for a in args2 if a.requires_grad], allow_unused=True)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_gather_matches_torch(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = shape[axis]
    idx = torch.tensor(data.draw(st.lists(st.integers(-d, d - 1), min_size=1, max_size=5)))
    a = axis % len(shape)

    def theirs(x):
        return torch.stack([x.select(a, int(i) % d) for i in idx], dim=a)

    _same_grads(lambda x: fn("Gather")(x, idx, axis=axis), theirs, torch.randn(shape, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_expand_broadcasts_like_torch(shape, data):
    target = [data.draw(st.sampled_from([1, d])) for d in shape]
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    x = torch.randn(target, dtype=torch.float64)
    out = lead + [data.draw(st.sampled_from([1, d])) if t == d else d for t, d in zip(target, shape)]
    _same_grads(lambda x: fn("Expand")(x, torch.tensor(out)),
                lambda x: x.expand(torch.broadcast_shapes(x.shape, tuple(out))), x)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, data=st.data())
def test_slice_matches_numpy(shape, data):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    big = st.sampled_from([2**63 - 1, -2**63])
    starts = [data.draw(st.integers(-6, 6) | big) for _ in axes]
    ends = [data.draw(st.integers(-6, 6) | big) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    y = fn("Slice")(x, torch.tensor(starts), torch.tensor(ends), torch.tensor(axes), torch.tensor(steps))
    sl = [slice(None)] * len(shape)
    for a, s, e, t in zip(axes, starts, ends, steps):
        d = shape[a]
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        if t > 0:  # the spec's clamping, then numpy does the stepping
            sl[a] = slice(min(max(s, 0), d), min(max(e, 0), d), t)
        else:
            e = min(max(e, -1), d - 1)
            sl[a] = slice(min(max(s, 0), d - 1), None if e < 0 else e, t)
    want = x.detach().numpy()[tuple(sl)]
    np.testing.assert_array_equal(y.detach().numpy(), want)
    w = torch.randn_like(y)
    (g,) = torch.autograd.grad((y * w).sum(), x)
    expect = np.zeros(shape)
    expect[tuple(sl)] = w.numpy()
    np.testing.assert_array_equal(g.numpy(), expect)


@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_pad_matches_numpy(shape, data):
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    most = 6 if mode != "reflect" else 5
    pads = [data.draw(st.integers(0, most)) for _ in range(2 * len(shape))]
    if mode == "reflect":
        pads = [p if d > 1 else 0 for p, d in zip(pads, shape + shape)]
    x = torch.randn(shape, dtype=torch.float64)
    y = fn("Pad")(x, torch.tensor(pads), torch.tensor(0.5, dtype=torch.float64), mode=mode)
    width = list(zip(pads[:len(shape)], pads[len(shape):]))
    kw = {"constant_values": 0.5} if mode == "constant" else {}
    np.testing.assert_array_equal(y.numpy(), np.pad(x.numpy(), width, mode=mode, **kw))


@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_concat_transpose_match_torch(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(st.integers(0, 3))
    perm = data.draw(st.permutations(range(len(shape))))
    a, b = torch.randn(shape, dtype=torch.float64), torch.randn(other, dtype=torch.float64)
    _same_grads(lambda a, b: fn("Transpose")(fn("Concat")(a, b, axis=axis), perm=list(perm)),
                lambda a, b: torch.cat([a, b], axis).permute(*perm), a, b)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_scatter_elements_matches_torch(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = shape[axis]
    ishape = list(shape)
    ishape[axis] = data.draw(st.integers(1, 3))
    idx = torch.tensor(np.asarray(data.draw(st.lists(st.integers(-d, d - 1), min_size=int(np.prod(ishape)),
                                                     max_size=int(np.prod(ishape))))).reshape(ishape))
    reduction = data.draw(st.sampled_from(["add", "mul"]))
    x, u = torch.randn(shape, dtype=torch.float64), torch.randn(ishape, dtype=torch.float64)
    red = {"add": "sum", "mul": "prod"}[reduction]
    _same_grads(lambda x, u: fn("ScatterElements", 18)(x, idx, u, axis=axis, reduction=reduction),
                lambda x, u: x.scatter_reduce(axis % len(shape), idx % d, u, red), x, u)
