"""torch modules exported by torch's TorchScript exporter: the engine, running the exported graph,
must reproduce torch's own outputs (float32) and torch.autograd.grad on the module itself (float64).

The oracle is the torch module, not the ONNX file: the exporter and the engine are each checked
against what the user actually wrote. Modules live in tests/torch_export_models.py (nn modules)
and tests/torch_export_functional.py (functions of the inputs, the elementwise family, known gaps).
"""
from __future__ import annotations

import io
import warnings
import zlib

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import engine
from tests.torch_export_functional import ELEMENTWISE, FUNCTIONAL_CASES, Elementwise
from tests.torch_export_models import NN_CASES, ExportCase, Fn

ALL_CASES = NN_CASES + FUNCTIONAL_CASES


def export(module: torch.nn.Module, inputs, opset: int, dynamic=None) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(inputs), buf, input_names=[f"x{i}" for i in range(len(inputs))],
                          output_names=["y"], opset_version=opset, dynamo=False, do_constant_folding=False,
                          dynamic_axes=dynamic)
    return buf.getvalue()


def make_inputs(shapes, gen: torch.Generator) -> list[torch.Tensor]:
    """Float inputs from a shape; ("int", high | (low, high), shape) for indices; ("lengths", values)."""
    out = []
    for s in shapes:
        if s and s[0] == "int":
            low, high = s[1] if isinstance(s[1], tuple) else (0, s[1])
            out.append(torch.randint(low, high, s[2], generator=gen))
        elif s and s[0] == "lengths":
            out.append(torch.tensor(s[1]))
        else:
            out.append(torch.randn(s, generator=gen))
    return out


def build(c: ExportCase, gen: torch.Generator) -> torch.nn.Module:
    """The module with its parameters nudged off their (often shared) initial values, so the
    exporter cannot merge two equal initializers into one name."""
    torch.manual_seed(zlib.crc32(c.name.encode()))
    module = c.build()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def feeds_of(inputs) -> dict[str, np.ndarray]:
    return {f"x{i}": t.detach().numpy() for i, t in enumerate(inputs)}


def torch_grads(module, inputs, params, gen):
    """y and dy/d(float inputs, params) by torch.autograd.grad on the module itself, float64."""
    module = module.double()
    leaves = [t.double().requires_grad_() if t.is_floating_point() else t for t in inputs]
    named = dict(module.named_parameters())
    wrt = [t for t in leaves if t.is_floating_point()] + [named[p] for p in params]
    y = module(*leaves)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(y, wrt, dy, allow_unused=True)
    grads = [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads)]
    return leaves, y.detach(), dy, [g.numpy() for g in grads]


def assert_close(got, want, rtol, atol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != torch's {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


CASES = [pytest.param(c, opset, id=f"{c.name}-op{opset}") for c in ALL_CASES for opset in c.opsets]


@pytest.mark.parametrize("c, opset", CASES)
def test_exported_module_matches_torch(c: ExportCase, opset: int):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{c.name}/{opset}".encode()))
    module = build(c, gen)
    inputs = make_inputs(c.shapes, gen)
    try:
        data = export(module, inputs, opset, c.dynamic)
    except torch.onnx.errors.OnnxExporterError as exc:
        if c.export_limit:
            pytest.skip(f"{c.export_limit} ({type(exc).__name__})")
        raise
    present = {n.op_type for n in onnx.load_from_string(data).graph.node}
    assert c.ops <= present, f"exported graph lacks {sorted(c.ops - present)}; it has {sorted(present)}"
    if c.engine_gap:  # once the op exists this fails, and the case becomes a real check
        with pytest.raises(engine.UnsupportedOpError, match=f"op {c.engine_gap} "):
            engine.load(data)
        pytest.xfail(f"our engine does not implement {c.engine_gap}, which the exported graph needs")
    model = engine.load(data)

    # (1) forward, float32, at the export shapes and at any other sizes the dynamic axes allow
    for shapes in (c.shapes,) + ((c.resized,) if c.resized else ()):
        xs = inputs if shapes is c.shapes else make_inputs(shapes, gen)
        with torch.no_grad():
            want = module(*xs).numpy()
        got = model.run(feeds_of(xs))["y"]
        assert got.dtype == np.float32, got.dtype
        assert_close(got, want, c.fwd_rtol, 1e-5, f"forward at {shapes}")

    # (2) gradients, float64, against torch.autograd.grad on the module
    missing = [p for p in c.params if p not in model.graph.initializers]
    assert not missing, f"{missing} are not initializers; the exporter kept {sorted(model.graph.initializers)}"
    leaves, y, dy, want = torch_grads(module, inputs, c.params, gen)
    float_inputs = [f"x{i}" for i, t in enumerate(leaves) if t.is_floating_point()]
    int_inputs = [f"x{i}" for i, t in enumerate(leaves) if not t.is_floating_point()]
    wrt = float_inputs + list(c.params)
    result = model.gradient("y", xs=wrt, zs=int_inputs, feeds=feeds_of(leaves), dy=dy.numpy(), dtype="float64")
    assert result.y.dtype == np.float64
    assert_close(result.y, y.numpy(), c.grad_rtol, c.grad_rtol, "y in float64")
    for name, g in zip(wrt, want):
        scale = max(1.0, float(np.abs(g).max(initial=0.0)))
        assert_close(result.grads[name], g, c.grad_rtol, c.grad_rtol * scale, f"d y / d {name}")


# --- the elementwise family, with hypothesis choosing shapes and values ----------------------------
DOMAINS = {"real": (-3.0, 3.0), "pos": (0.25, 3.0), "unit": (-0.875, 0.875), "prob": (0.125, 0.875)}
_EXPORTED: dict[str, engine.Model] = {}


def _elementwise_model(op: Elementwise) -> engine.Model:
    if op.name not in _EXPORTED:
        example = [torch.rand(2, 3) + 0.5, torch.rand(3) + 0.5][: len(op.domains)]
        dynamic = {"x0": {0: "a", 1: "b"}, "x1": {0: "b"}, "y": {0: "a", 1: "b"}}
        data = export(Fn(op.f), example, 13, {k: v for k, v in dynamic.items() if k != "x1" or len(example) > 1})
        _EXPORTED[op.name] = engine.load(data)
    return _EXPORTED[op.name]


def _away(x: np.ndarray, points, margin=0.05) -> np.ndarray:
    """x moved off points where the function has no derivative (torch and ONNX may pick different
    subgradients there, and neither is wrong)."""
    for k in points:
        x = np.where(np.abs(x - k) < margin, x + 2 * margin, x)
    return x.astype(np.float32)


@pytest.mark.parametrize("op", ELEMENTWISE, ids=[op.name for op in ELEMENTWISE])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_elementwise_matches_torch(op: Elementwise, data):
    model = _elementwise_model(op)
    if op.op:
        assert op.op in {n.op_type for n in model.graph.nodes}
    a, b = data.draw(st.integers(1, 3), "a"), data.draw(st.integers(1, 4), "b")
    arrays = []
    for k, dom in enumerate(op.domains):
        lo, hi = DOMAINS[dom]
        elems = st.floats(lo, hi, width=32, allow_subnormal=False)
        arrays.append(data.draw(hnp.arrays(np.float32, (a, b) if k == 0 else (b,), elements=elems), f"x{k}"))
    arrays[0] = _away(arrays[0], op.kinks)
    if op.ties:
        arrays[0] = _away(arrays[0] - arrays[1], (0.0,)) + arrays[1]
    inputs = [torch.from_numpy(v) for v in arrays]
    got = model.run(feeds_of(inputs))["y"]
    with torch.no_grad():
        want = op.f(*inputs).numpy()
    assert_close(got, want, 1e-5, 1e-6, "forward float32")

    gen = torch.Generator().manual_seed(a * 10 + b)
    leaves, y, dy, grads = torch_grads(Fn(op.f), inputs, (), gen)
    names = [f"x{k}" for k in range(len(inputs))]
    result = model.gradient("y", xs=names, feeds=feeds_of(leaves), dy=dy.numpy(), dtype="float64")
    assert_close(result.y, y.numpy(), 1e-10, 1e-12, "y in float64")
    for name, g in zip(names, grads):
        assert_close(result.grads[name], g, 1e-9, 1e-9, f"d y / d {name}")
