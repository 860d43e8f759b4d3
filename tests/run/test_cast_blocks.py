"""A MatMul or Gemm casting its big float32 B one block of columns at a time (engine/run/cast_blocks.py)
gives the values and derivatives of the product with B cast whole: reverse mode, double backward,
forward mode (dual tensors, torch.func.jvp) and vmap, checked against torch's own ops in float64."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.ops.nn import gemm, matmul
from engine.run import cast_at_use, cast_blocks

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)
K, N = 24, 103  # 103 columns in blocks of 10: ten full blocks and a ragged one


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(cast_blocks, "BLOCK_BYTES", 10 * K * 8)


def _weight(shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _casts(monkeypatch) -> list[tuple[int, weakref.ref]]:
    """(element count, a weak reference) of every cast copy made from now on."""
    copies, made = [], cast_at_use.cast_one

    def recorded(source, dtype):
        out = made(source, dtype)
        if out is not source:
            copies.append((out.numel(), weakref.ref(out)))
        return out

    monkeypatch.setattr(cast_at_use, "cast_one", recorded)
    return copies


CASES = {  # name: (the step's op, B as stored, extra args, kwargs, the product with B cast whole)
    "matmul": (matmul, (K, N), (), {}, lambda a, b: a @ b),
    "gemm": (gemm, (K, N), (), {}, lambda a, b: a @ b),
    "gemm transB, C per column, alpha, beta": (
        gemm, (N, K), (torch.linspace(-1, 1, N, dtype=F64),), dict(transB=1, alpha=0.5, beta=2.0),
        lambda a, b: 0.5 * (a @ b.T) + 2.0 * torch.linspace(-1, 1, N, dtype=F64)),
    "gemm C per row": (gemm, (K, N), (torch.arange(5, dtype=F64).reshape(5, 1),), {},
                       lambda a, b: a @ b + torch.arange(5, dtype=F64).reshape(5, 1)),
}


def _case(name):
    op, shape, extra, kwargs, plain = CASES[name]
    b = _weight(shape)
    a_shape = (2, 3, 5, K) if op is matmul else (5, K)
    a = torch.randn(a_shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    step = cast_blocks.cast_in_blocks(op, F64)
    return (lambda x: step(x, b, *extra, **kwargs)), (lambda x: plain(x, b.to(F64))), a, b


@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_are_those_of_the_whole_cast(name, small_blocks, monkeypatch):
    copies = _casts(monkeypatch)
    blocked, plain, a, b = _case(name)
    x = a.clone().requires_grad_()
    y = blocked(x)
    assert copies and max(n for n, _ in copies) <= 10 * K < b.numel()  # never the whole weight
    want = plain(a)
    torch.testing.assert_close(y, want, **TOL)
    dy = torch.randn_like(want)
    (g,) = torch.autograd.grad(y, x, dy)
    xp = a.clone().requires_grad_()
    (g_want,) = torch.autograd.grad(plain(xp), xp, dy)
    torch.testing.assert_close(g, g_want, **TOL)


@pytest.mark.parametrize("name", CASES)
def test_forward_mode_dual_tensors_and_jvp(name, small_blocks):
    blocked, plain, a, _ = _case(name)
    v = torch.randn_like(a)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(blocked(fwAD.make_dual(a, v)))
    y_want, t_want = torch.func.jvp(plain, (a,), (v,))
    torch.testing.assert_close(out.primal, y_want, **TOL)
    torch.testing.assert_close(out.tangent, t_want, **TOL)
    _, t_func = torch.func.jvp(blocked, (a,), (v,))
    torch.testing.assert_close(t_func, t_want, **TOL)


@pytest.mark.parametrize("name", CASES)
def test_vmap_and_forward_over_reverse(name, small_blocks):
    blocked, plain, a, _ = _case(name)
    batch = torch.stack([a, 2 * a, -a])
    torch.testing.assert_close(torch.func.vmap(blocked)(batch), torch.func.vmap(plain)(batch), **TOL)

    def loss(f):  # nonlinear in x, so its Hessian is not zero
        return lambda x: torch.tanh(f(x)).pow(2).sum()

    v = torch.randn_like(a)
    hvp = torch.func.jvp(torch.func.grad(loss(blocked)), (a,), (v,))[1]
    torch.testing.assert_close(hvp, torch.func.jvp(torch.func.grad(loss(plain)), (a,), (v,))[1], **TOL)
    x = a.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(blocked)(x), x, create_graph=True)  # double backward
    (gg,) = torch.autograd.grad((g * v).sum(), x)
    torch.testing.assert_close(gg, hvp, **TOL)


def test_a_small_weight_is_cast_whole(monkeypatch):
    copies = _casts(monkeypatch)
    b = _weight((K, N))
    a = torch.randn(5, K, dtype=F64)
    torch.testing.assert_close(cast_blocks.cast_in_blocks(matmul, F64)(a, b), a @ b.to(F64), **TOL)
    assert [n for n, _ in copies] == [K * N]


def _head(vocab=4096, d=32):
    """h [3, d] -> MatMul(W [d, vocab]) -> Tanh -> logits: an lm_head whose weight is cast in blocks."""
    w = np.random.default_rng(0).standard_normal((d, vocab)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["z"], name="head"), helper.make_node("Tanh", ["z"], ["y"])],
        "head", [helper.make_tensor_value_info("h", TensorProto.FLOAT, [3, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, vocab])], [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@pytest.mark.parametrize("mode", ["interpret", "fx"])
def test_a_plan_casts_a_big_weight_block_by_block_and_keeps_no_copy(mode, monkeypatch):
    from engine.run import plan as plan_module

    monkeypatch.setattr(plan_module, "DEFAULT_MODE", mode)
    monkeypatch.setattr(cast_blocks, "BLOCK_BYTES", 32 * 500 * 8)  # 500 columns a block: 9 blocks
    proto, w = _head()
    model = engine.load(proto)
    plan = model.prepare(["h"], ["y"], dtype="float64")
    step = next(s for s in plan.run_steps if s.op_type == "MatMul")
    assert step.cast == () and getattr(step.fn, "no_fold", False)
    copies = _casts(monkeypatch)
    h = torch.randn(3, 32, dtype=F64)
    for _ in range(2):  # interpreted, then (fx) the module
        x = h.clone().requires_grad_()
        (y,) = plan.run([x])
    gc.collect()
    assert copies and max(n for n, _ in copies) <= 32 * 500 and all(c() is None for _, c in copies)
    w64 = torch.from_numpy(w.astype(np.float64))
    torch.testing.assert_close(y, torch.tanh(h @ w64), **TOL)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(g, (1 - torch.tanh(h @ w64) ** 2) @ w64.T, **TOL)


_RETAINED = """
import torch, sys
from engine.run.allocator import hold_mmap_threshold
held = hold_mmap_threshold() if sys.argv[1] == "hold" else None
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) * 1024
start = rss()
for size in (24, 20, 16, 12, 8, 4, 22, 18):  # freed blocks of falling sizes: a sliding threshold keeps them
    blocks = [torch.ones(size << 17, dtype=torch.float64) for _ in range(4)]
    del blocks
print(held, rss() - start)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/status")
def test_freed_tensors_leave_resident_memory_under_a_held_threshold():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", _RETAINED, "hold"], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    if out[0] != "True":
        pytest.skip("not glibc: no mmap threshold to hold")
    assert int(out[1]) < 16 << 20  # of the 4 x 24 MiB blocks and the rest, nothing stays resident
