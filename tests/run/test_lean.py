"""engine/run/lean.py and `gradient.vjp`: Relu and Conv that keep less for autograd give torch's own
gradient bits (against the plain plan and torch code written directly), keep no float activation,
and a gradient with a seed tensor does not import sympy."""
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.gradient.prepared import PreparedGradient, vjp
from engine.run.plan import Plan

CPU = torch.device("cpu")


def conv_net(nd: int, channels: int, groups: int, stride: int, dilation: int, auto_pad: str, bias: bool,
             shared: bool, seed: int = 0):
    """x -> Conv(w1) -> Relu -> Conv(w2) -> Relu -> y. `shared`: the first Conv's output is also
    added to the last Relu's (two readers, so it is not joined to its Relu)."""
    rng = np.random.default_rng(seed)
    k = [3] * nd
    w1 = rng.standard_normal([channels, channels // groups, *k]).astype(np.float32)
    w2 = rng.standard_normal([channels, channels // groups, *k]).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    attrs = dict(group=groups, strides=[stride] * nd, dilations=[dilation] * nd)
    attrs.update(auto_pad=auto_pad) if auto_pad != "NOTSET" else attrs.update(pads=[1] * nd + [0] * nd)
    ins1, ins2 = ["x", "w1"], ["r1", "w2"]
    if bias:
        inits += [numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")]
        ins1, ins2 = ins1 + ["b"], ins2 + ["b"]
    nodes = [helper.make_node("Conv", ins1, ["c1"], **attrs), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ins2, ["c2"], **{**attrs, "strides": [1] * nd, "dilations": [1] * nd}),
             helper.make_node("Relu", ["c2"], ["r2" if shared else "y"])]
    if shared:
        nodes.append(helper.make_node("ReduceMean", ["c1"], ["m"], keepdims=1))
        nodes.append(helper.make_node("Add", ["r2", "m"], ["y"]))
    dims = [f"d{i}" for i in range(nd + 2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"o{d}" for d in dims])], inits)
    return engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def plans(model, sources):
    kw = dict(device=CPU, float_dtype=None, constants=model.constants(CPU, None))
    return Plan(model.graph, sources, ["y"], **kw, lean_autograd=True), \
        Plan(model.graph, sources, ["y"], **kw, lean_autograd=False)


def run(model, plan, xs, x, calls=2):
    """y and dy/dxs through `plan` (interpreter on the first call, fx after), seed random."""
    consts = model.constants(CPU, None)
    values = [torch.from_numpy(x) if n == "x" else consts[n] for n in plan.sources]
    spec = model.selection("y", xs, [n for n in plan.sources if n not in xs])
    prepared = PreparedGradient(spec, plan)
    outs = []
    for _ in range(calls):
        out = prepared(*values, dy=lambda y: torch.randn(y.shape, generator=torch.Generator().manual_seed(1)))
        outs.append([out.y, *out.grads])
    return outs


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nd=st.sampled_from([1, 2, 3]), groups=st.sampled_from([1, 2]), stride=st.sampled_from([1, 2]),
       dilation=st.sampled_from([1, 2]), auto_pad=st.sampled_from(["NOTSET", "SAME_UPPER", "VALID"]),
       bias=st.booleans(), shared=st.booleans(), xs=st.sampled_from([["x"], ["w2"], ["w1"], ["x", "w2"]]))
def test_lean_gradients_are_the_plain_plans_bits(nd, groups, stride, dilation, auto_pad, bias, shared, xs):
    model = conv_net(nd, 4, groups, stride, dilation, auto_pad, bias, shared)
    x = np.random.default_rng(5).standard_normal([2, 4] + [{1: 12, 2: 10, 3: 9}[nd]] * nd).astype(np.float32)
    x[0, 0].flat[0] = 0.0  # a Relu input at exactly 0 (the derivative there is 0)
    lean, plain = plans(model, ["x", "w1", "w2"] + (["b"] if bias else []))
    assert "ConvRelu" in {s.op_type for s in lean.run_steps} and plain.run_steps is plain.steps
    assert ("Relu" in {s.op_type for s in lean.run_steps}) == shared  # a Conv read twice stays apart
    for got, want in zip(run(model, lean, xs, x), run(model, plain, xs, x)):
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def eager(x, w1, w2, b, dy):
    """The first net of `conv_net(2, ..., groups=1, stride=2, NOTSET, shared=False)` in torch, directly."""
    h = F.relu(F.conv2d(F.pad(x, [1, 0, 1, 0]), w1, b, stride=2))
    y = F.relu(F.conv2d(F.pad(h, [1, 0, 1, 0]), w2, b))
    return torch.autograd.grad(y, x, dy)[0], y


def test_lean_gradient_is_torch_eager_bits_and_keeps_no_float_activation():
    model = conv_net(2, 8, 1, 2, 1, "NOTSET", True, False)
    rng = np.random.default_rng(2)
    x = rng.standard_normal([1, 8, 32, 32]).astype(np.float32)
    consts = model.constants(CPU, None)
    lean, plain = plans(model, ["x", "w1", "w2", "b"])
    saved = {}

    def keep(t):
        saved.setdefault(id(lean) if keep.lean else id(plain), []).append(t)
        return t

    grads = {}
    for keep.lean, plan in ((True, lean), (False, plain)):
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            (out,) = run(model, plan, ["x"], x, calls=1)
        grads[keep.lean] = out
    xt = torch.from_numpy(x).requires_grad_()
    dy = torch.randn(grads[True][0].shape, generator=torch.Generator().manual_seed(1))
    want_dx, want_y = eager(xt, consts["w1"], consts["w2"], consts["b"], dy)
    assert torch.equal(grads[True][0], want_y) and torch.equal(grads[True][1], want_dx)
    assert torch.equal(grads[False][1], want_dx)
    kept = {t.dtype for t in saved[id(lean)] if not any(t is consts[n] for n in ("w1", "w2"))}
    assert kept == {torch.bool}  # the Relus' masks; the plain plan keeps float activations
    assert torch.float32 in {t.dtype for t in saved[id(plain)] if not any(t is consts[n] for n in ("w1", "w2"))}


def test_relu_passes_nan_and_blocks_zero_as_torch_does():
    model = conv_net(1, 2, 1, 1, 1, "NOTSET", False, False)
    x = np.array([[[np.nan, 0.0, -1.0, 2.0, 0.5], [1.0, -0.0, 3.0, np.nan, -2.0]]], np.float32)
    lean, plain = plans(model, ["x", "w1", "w2"])
    for got, want in zip(run(model, lean, ["x"], x), run(model, plain, ["x"], x)):
        for a, b in zip(got, want):
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(a.isnan(), b.isnan())


def test_inference_and_nested_gradients_take_the_plain_ops():
    model = conv_net(2, 4, 2, 1, 1, "SAME_UPPER", True, False)
    x = np.random.default_rng(3).standard_normal([1, 4, 6, 6]).astype(np.float32)
    lean, plain = plans(model, ["x"])
    with torch.no_grad():
        assert torch.equal(lean.run([torch.from_numpy(x)])[0], plain.run([torch.from_numpy(x)])[0])
    spec = model.selection("y", ["x"])
    xt = torch.from_numpy(x).requires_grad_()
    first = PreparedGradient(spec, lean)(xt, create_graph=True).grads[0]
    assert first.grad_fn is not None  # differentiable again: the plain steps ran
    (second,) = torch.autograd.grad(first.sum(), xt, allow_unused=True)
    assert second is None or torch.isfinite(second).all()


@pytest.mark.parametrize("shape", [(3,), (2, 5)])
def test_vjp_is_autograd_grad(shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(x * w) * x
    seed = torch.randn(shape, dtype=torch.float64)
    want = torch.autograd.grad(y, [x, w], seed, retain_graph=True)
    got = vjp(y, [x, w], seed)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    unused = torch.zeros(2, requires_grad=True)
    assert vjp(y, [unused], seed) == (None,)


def test_a_seeded_gradient_does_not_import_sympy():
    """torch.autograd.grad with a seed tensor imports sympy (34 MB, ~480 modules) on first use."""
    code = ("import sys, numpy as np, engine\n"
            "from tests.run.test_lean import conv_net\n"
            "m = conv_net(2, 4, 1, 1, 1, 'NOTSET', False, False)\n"
            "x = np.ones((1, 4, 5, 5), np.float32)\n"
            "r = m.gradient('y', ['x'], [], feeds={'x': x})\n"
            "r = m.gradient('y', ['x'], [], feeds={'x': x}, dy=np.ones(r.y.shape, np.float32))\n"
            "assert np.abs(r.grads['x']).sum() > 0\n"
            "print('sympy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "False"
