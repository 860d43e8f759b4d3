"""The Gradient spec's three diagrams as DOT: snapshots of the forward, backward and combined views.

The first diagram is engine.examples.spec_conv_gemm (Gradient(xs=[W, Z], zs=[X], y=Y)); the
second and third are built here with onnx.helper so the snapshots depend on nothing else:
  2. Gradient(xs=[H, Z], y=Y) — an intermediate H, so the backward graph stops at the cut;
  3. O = sum((X W - L)^2) with Gradient(xs=[X, W], zs=[L], y=O) and a second Gradient of dO/dW.
Set ONNXGRAD_UPDATE_SNAPSHOTS=1 to rewrite the files under tests/snapshots_graphs/.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.examples import spec_conv_gemm
from engine.graphs import to_dot
from engine.modelfile.index import TRAINING_DOMAIN

SNAPSHOTS = pathlib.Path(__file__).parent / "snapshots_graphs"
F = TensorProto.FLOAT


def _model(name, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(TRAINING_DOMAIN, 1)])
    model.ir_version = 8
    return model


def vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def grad_wrt_h():
    """Diagram 2: the first diagram's graph, differentiated with respect to the intermediate H."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "W")
    z = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "Z")
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["H"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Flatten", ["H"], ["H_flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["H_flat", "Z"], ["Y"], name="gemm"),
        helper.make_node("Gradient", ["H", "Z"], ["dY_dH", "dY_dZ"], name="gradient", domain=TRAINING_DOMAIN,
                         xs=["H", "Z"], y="Y"),
    ]
    return _model("spec_grad_wrt_h", nodes, [vi("X", [1, 1, 4, 4])],
                  [vi("Y", [1, 3]), vi("dY_dH", [1, 2, 2, 2]), vi("dY_dZ", [8, 3])], [w, z])


def second_order():
    """Diagram 3: W -> Gemm -> Y -> Loss -> O, a Gradient of O and a Gradient of dO/dW."""
    members = dict(xs=["X", "W"], zs=["L"], domain=TRAINING_DOMAIN)
    nodes = [
        helper.make_node("Gemm", ["X", "W"], ["Y"], name="gemm"),
        helper.make_node("Sub", ["Y", "L"], ["E"], name="error"),
        helper.make_node("Mul", ["E", "E"], ["E2"], name="square"),
        helper.make_node("ReduceSum", ["E2"], ["O"], name="loss", keepdims=0),
        helper.make_node("Gradient", ["X", "W", "L"], ["dO_dX", "dO_dW"], name="gradient", y="O", **members),
        helper.make_node("Gradient", ["X", "W", "L"], ["d2O_dWdX", "d2O_dW2"], name="gradient_of_gradient",
                         y="dO_dW", **members),
    ]
    return _model("spec_second_order", nodes, [vi("X", [4, 3]), vi("W", [3, 2]), vi("L", [4, 2])],
                  [vi("O", []), vi("dO_dX", [4, 3]), vi("dO_dW", [3, 2]), vi("d2O_dWdX", [4, 3]),
                   vi("d2O_dW2", [3, 2])])


DIAGRAMS = {"conv_gemm": spec_conv_gemm, "grad_wrt_h": grad_wrt_h, "second_order": second_order}
VIEWS = ("forward", "backward", "combined")


@pytest.fixture(scope="module")
def models():
    return {name: engine.load(build()) for name, build in DIAGRAMS.items()}


def _ids_by_label(dot: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r'^\s*(v\d+) \[label="?([^"\n]+?)"?[\s\n]', dot, re.M)}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("diagram", sorted(DIAGRAMS))
def test_dot_snapshot(models, diagram, view):
    dot = to_dot(models[diagram], view=view)
    path = SNAPSHOTS / f"{diagram}_{view}.dot"
    if os.environ.get("ONNXGRAD_UPDATE_SNAPSHOTS"):
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(dot, encoding="utf-8")
    assert path.exists(), f"no snapshot {path.name}: rerun with ONNXGRAD_UPDATE_SNAPSHOTS=1"
    assert dot == path.read_text(encoding="utf-8")


def test_first_diagram_backward_runs_gemm_flatten_conv_and_returns_dw_dz(models):
    dot = to_dot(models["conv_gemm"], view="backward")
    assert 'label="gradient: Gradient(xs=[W, Z], zs=[X], y=Y)"' in dot
    ids = _ids_by_label(dot)
    order = [int(ids[label][1:]) for label in ("dY", "∂Gemm", "∂Flatten", "∂Conv", "dY/dW")]
    assert order == sorted(order)  # seed at the top, dx at the bottom
    assert f'{ids["∂Gemm"]} -> {ids["∂Flatten"]} [label=dH_flat' in dot
    assert f'{ids["∂Conv"]} -> {ids["dY/dW"]} [label=dW' in dot
    assert f'{ids["∂Gemm"]} -> {ids["dY/dZ"]} [label=dZ' in dot  # Z's gradient skips Flatten and Conv


def test_second_diagram_backward_stops_at_the_cut(models):
    dot = to_dot(models["grad_wrt_h"], view="backward")
    assert "∂Conv" not in dot  # H is in xs: what computes H is not differentiated
    ids = _ids_by_label(dot)
    assert f'{ids["∂Flatten"]} -> {ids["dY/dH"]} [label=dH' in dot
    model = models["grad_wrt_h"]
    forward = to_dot(model, model.selection("Y", ["H", "Z"]), view="forward")
    assert re.search(r'label="Conv\n[^\]]*style="rounded,dashed"', forward)  # Conv dimmed: off the slice
    assert "taillabel=cut" in forward


def test_third_diagram_has_a_cluster_per_gradient_node(models):
    dot = to_dot(models["second_order"], view="combined")
    assert dot.count("subgraph cluster_") == 2
    assert 'label="gradient: Gradient(xs=[X, W], zs=[L], y=O)"' in dot
    assert 'label="gradient_of_gradient: Gradient(xs=[X, W], zs=[L], y=dO_dW)"' in dot
    assert "∂Gradient" in dot  # the second Gradient differentiates through the first one


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")
@pytest.mark.parametrize("view", VIEWS)
def test_real_dot_produces_svg_that_parses(models, tmp_path, view):
    from engine.graphs import render

    for name, model in models.items():
        out = render(to_dot(model, view=view), tmp_path / f"{name}.svg")
        root = ET.parse(out).getroot()
        assert root.tag.endswith("svg")
        titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
        assert any(t and t.startswith("v") for t in titles)


def test_diagram_models_compute_what_the_spec_says(models):
    """The builders are right: the Gradient nodes agree with torch written directly."""
    import torch

    rng = np.random.default_rng(5)
    x, w, label = (rng.standard_normal(s) for s in ((4, 3), (3, 2), (4, 2)))
    out = models["second_order"].run({"X": x, "W": w, "L": label}, dtype="float64")
    X, W, L = (torch.tensor(a, requires_grad=True) for a in (x, w, label))
    (dW,) = torch.autograd.grad(((X @ W - L) ** 2).sum(), [W], create_graph=True)
    (d2,) = torch.autograd.grad(dW.sum(), [W])
    np.testing.assert_allclose(out["dO_dW"], dW.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(out["d2O_dW2"], d2.numpy(), rtol=1e-10)


def test_collapsed_chains_in_dot():
    model = engine.load(spec_conv_gemm(with_gradient=False))
    dot = to_dot(model, collapse_chains=True)
    assert 'label="Conv … Gemm ×3"' in dot and "peripheries=2" in dot
    assert "Flatten" not in dot
