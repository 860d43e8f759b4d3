"""J·v and H·v of exported torch modules against torch.func on the module itself (the issue's oracle).

J·v: `torch.func.jvp` along the same tangents, in float64 (relative L2 ≤ 1e-6) and float32 (≤ 1e-4).
H·v: `torch.func.jvp(torch.func.grad(f))` (forward over reverse) of the scalar ⟨w, module(x)⟩, the
ONNX file given the same reduction as two nodes, in float64.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import engine
from tests.run.test_torch_export import ALL_CASES, build, export, make_inputs

CASES = [pytest.param(c, id=c.name) for c in ALL_CASES if not c.engine_gap and not c.export_limit]


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def setup(c, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(zlib.crc32(f"jvp/{c.name}".encode()))
    module = build(c, gen)
    inputs = make_inputs(c.shapes, gen)
    try:
        data = export(module, inputs, c.opsets[0], c.dynamic)
    except torch.onnx.errors.OnnxExporterError as exc:
        pytest.skip(f"torch's exporter: {type(exc).__name__}")
    module = module.to(dtype)
    inputs = [t.to(dtype) if t.is_floating_point() else t for t in inputs]
    floats = [i for i, t in enumerate(inputs) if t.is_floating_point()]
    # requiring grad keeps torch's own modules off their inference fast paths (nn.MultiheadAttention's
    # fused kernel has no forward-mode rule): the oracle is the plain math
    params = {k: v.detach().requires_grad_() for k, v in module.named_parameters()}
    wrt = [f"x{i}" for i in floats] + list(c.params)
    tangents = {n: torch.randn((inputs[int(n[1:])] if n[0] == "x" and n[1:].isdigit() and n not in params
                                else params[n]).shape, generator=gen, dtype=torch.float64).to(dtype) for n in wrt}
    return module, inputs, floats, params, wrt, tangents, data, gen


def torch_fn(module, inputs, floats, params, wrt):
    """f(*values of wrt) -> module's output, the other inputs and parameters held."""
    def f(*values):
        given = dict(zip(wrt, values))
        xs = [given.get(f"x{i}", t) for i, t in enumerate(inputs)]
        ps = {k: given.get(k, v) for k, v in params.items()}
        return torch.func.functional_call(module, ps, tuple(xs))
    return f


def oracle_jvp(f, primal: tuple, tangent: tuple):
    """torch.func.jvp on torch's plain kernels (math attention, no oneDNN RNN); where torch itself has
    no forward rule (embedding_bag, cdist, grid_sample, packed sequences), J·v as the gradient in u
    of ⟨Jᵀu, v⟩: reverse over reverse, the same derivative through autograd alone; where torch has no
    double backward either, float64 central differences along v."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False):
        try:
            y, t = torch.func.jvp(f, primal, tangent)
            return y.detach(), t.detach()
        except NotImplementedError:
            pass
        xs = [p.detach().requires_grad_() for p in primal]
        y = f(*xs)
        try:
            u = torch.zeros_like(y, requires_grad=True)
            vjps = torch.autograd.grad(y, xs, u, create_graph=True, allow_unused=True)
            inner = sum((g * v).sum() for g, v in zip(vjps, tangent) if g is not None)
            (t,) = torch.autograd.grad(inner, u, allow_unused=True)
            return y.detach(), (torch.zeros_like(y) if t is None else t).detach()
        except NotImplementedError:
            pass
        with torch.no_grad():
            eps = 1e-6
            wide = [(p.double(), v.double()) for p, v in zip(primal, tangent)]
            up = f(*[(p + eps * v).to(q.dtype) for (p, v), q in zip(wide, primal)]).double()
            down = f(*[(p - eps * v).to(q.dtype) for (p, v), q in zip(wide, primal)]).double()
            return y.detach(), (up - down) / (2 * eps)


def primals(inputs, params, wrt):
    return tuple(inputs[int(n[1:])] if n.startswith("x") and n not in params else params[n] for n in wrt)


def feeds(inputs) -> dict:
    return {f"x{i}": t.detach().numpy() for i, t in enumerate(inputs)}


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-6), (torch.float32, 1e-4)], ids=["f64", "f32"])
@pytest.mark.parametrize("c", CASES)
def test_jvp_matches_torch_func_jvp(c, dtype, bound):
    module, inputs, floats, params, wrt, tangents, data, _ = setup(c, dtype)
    f = torch_fn(module, inputs, floats, params, wrt)
    primal, tangent = primals(inputs, params, wrt), tuple(tangents[n] for n in wrt)
    model = engine.load(data)
    ints = [f"x{i}" for i, t in enumerate(inputs) if not t.is_floating_point()]
    try:
        got = model.jvp("y", wrt, {n: t.detach().numpy() for n, t in tangents.items()}, zs=ints,
                        feeds=feeds(inputs), dtype=str(dtype).removeprefix("torch."))
    except engine.ForwardModeError as exc:  # refused in one line only where torch itself has no rule
        assert "\n" not in str(exc) and str(exc).startswith("node ")
        with pytest.raises(NotImplementedError, match="forward AD"), torch.backends.mkldnn.flags(enabled=False):
            torch.func.jvp(f, primal, tangent)
        return
    if dtype != torch.float64:  # the oracle in float64, on the same module, inputs and tangents
        module, inputs, floats, params, wrt, tangents, _, _ = setup(c, torch.float64)
        f, primal = torch_fn(module, inputs, floats, params, wrt), primals(inputs, params, wrt)
        tangent = tuple(tangents[n] for n in wrt)
    y_want, jvp_want = oracle_jvp(f, primal, tangent)
    assert got.jvp.shape == tuple(jvp_want.shape)
    assert got.jvp.dtype == np.dtype(str(dtype).removeprefix("torch."))
    assert rel(got.y, y_want) <= bound
    assert rel(got.jvp, jvp_want) <= bound, f"J·v off by {rel(got.jvp, jvp_want):.2e} (relative L2)"


def scalar_model(data: bytes, weights: np.ndarray) -> engine.Model:
    """The exported graph with loss = ReduceSum(y * w) appended: a scalar y for H·v."""
    proto = onnx.load_from_string(data)
    g = proto.graph
    g.initializer.append(numpy_helper.from_array(weights.astype(np.float32), "hvp_w"))
    g.node.extend([helper.make_node("Mul", ["y", "hvp_w"], ["hvp_yw"], name="hvp_mul"),
                   helper.make_node("ReduceSum", ["hvp_yw"], ["loss"], name="hvp_sum", keepdims=0)])
    g.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    return engine.load(proto)


@pytest.mark.parametrize("c", CASES[::2])  # every other case: forward over reverse costs a few backward passes
def test_hvp_matches_torch_forward_over_reverse(c):
    module, inputs, floats, params, wrt, tangents, data, gen = setup(c, torch.float64)
    f = torch_fn(module, inputs, floats, params, wrt)
    y0 = f(*primals(inputs, params, wrt)).detach()
    w = torch.randn(y0.shape, generator=gen, dtype=torch.float64)

    def loss(*values):
        return (f(*values) * w.to(torch.float32).double()).sum()

    primal, tangent = primals(inputs, params, wrt), tuple(tangents[n] for n in wrt)
    try:
        grad = torch.func.grad(loss, argnums=tuple(range(len(wrt))))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), \
                torch.backends.mkldnn.flags(enabled=False):
            _, want = torch.func.jvp(grad, primal, tangent)
    except NotImplementedError:  # no forward rule in torch: reverse over reverse (H is symmetric)
        want = torch.autograd.functional.hvp(loss, tuple(p.detach() for p in primal), tangent)[1]
    model = scalar_model(data, w.numpy())
    ints = [f"x{i}" for i, t in enumerate(inputs) if not t.is_floating_point()]
    got = model.hvp("loss", wrt, {n: t.detach().numpy() for n, t in tangents.items()}, zs=ints, feeds=feeds(inputs),
                    dtype="float64")
    scale = max(np.linalg.norm(np.concatenate([h.detach().numpy().ravel() for h in want])), 1e-30)
    for n, h in zip(wrt, want):
        err = np.linalg.norm(got.hvp[n] - h.detach().numpy()) / scale
        assert err <= 1e-6, f"H·v block {n} off by {err:.2e} (relative to the whole H·v)"
