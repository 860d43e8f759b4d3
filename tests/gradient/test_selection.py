"""Refusals and conventions of the Gradient selection (y, xs, zs)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.errors import FeedError, SelectionError, UnsupportedOpError
from engine.examples import default_feeds, spec_conv_gemm
from tests import spec_models


@pytest.fixture(scope="module")
def spec_model():
    return engine.load(spec_conv_gemm())


@pytest.mark.parametrize("y,xs,zs,message", [
    ("Y", ["H", "W"], ["X"], "'H' cannot be in xs: it is determined by 'W' and 'X'"),
    ("Y", ["Z"], [], "y 'Y' is not determined by xs ∪ zs: it depends on 'X'"),
    ("Y", ["W", "W"], ["X", "Z"], "'W' listed more than once"),
    ("Y", ["W", "Z"], ["W", "X"], "'W' listed more than once"),
    ("Nope", ["W"], ["X", "Z"], "y 'Nope' is not a tensor of this model"),
    ("Y", ["Zz"], ["X", "W"], "xs member 'Zz' is not a tensor of this model (did you mean 'Z'?)"),
    ("Y", [], ["X"], "xs is empty"),
])
def test_selection_refusals(spec_model, y, xs, zs, message):
    with pytest.raises(SelectionError) as err:
        spec_model.selection(y, xs, zs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_y_depending_on_an_unlisted_graph_input_names_it():
    model = engine.load(spec_conv_gemm())
    with pytest.raises(SelectionError, match="depends on 'X'"):
        model.selection("Y", ["W", "Z"], [])


def test_initializers_are_constants_unless_listed(spec_model):
    spec = spec_model.selection("Y", ["Z"], ["X"])  # W is an initializer: a constant here
    assert spec.inputs == ("Z", "X")


def test_intermediate_x_cuts_the_graph(spec_model):
    # H is an intermediate; X and W upstream of it are ignored, so they need not be fed.
    h1 = np.random.default_rng(0).standard_normal((1, 2, 2, 2)).astype(np.float32)
    res = spec_model.gradient("Y", ["H"], [], feeds={"H": h1})
    z = spec_model.constants()["Z"]
    np.testing.assert_allclose(res.grads["H"].reshape(1, 8), np.ones((1, 3), np.float32) @ z.numpy().T, rtol=1e-6)


def test_non_float_x_is_refused():
    model = engine.load(spec_models.with_initializer([1, 2, 3]))
    with pytest.raises(SelectionError, match="'Xi' is int64: only float tensors can be in xs"):
        model.selection("Y", ["Xi"], [])


def test_disconnected_x_gets_zeros_and_is_flagged():
    model = engine.load(spec_models.fan_out())
    res = model.gradient("Y", ["A", "D"], ["B"])
    assert res.disconnected == {"D"}
    np.testing.assert_array_equal(res.grads["D"], np.zeros(2, np.float32))
    assert np.abs(res.grads["A"]).sum() > 0


def test_x_reaching_y_only_through_non_differentiable_ops_is_flagged():
    nodes = [helper.make_node("Shape", ["A"], ["S"]), helper.make_node("Cast", ["S"], ["Y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    model = engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    res = model.gradient("Y", ["A"])
    assert res.disconnected == {"A"}
    np.testing.assert_array_equal(res.grads["A"], np.zeros((2, 3), np.float32))


def test_feeding_a_tensor_inside_the_cut_graph_is_refused(spec_model):
    with pytest.raises(SelectionError, match="feed 'H' is computed inside the differentiated graph"):
        spec_model.gradient("Y", ["W", "Z"], ["X"], feeds={**default_feeds(), "H": np.zeros((1, 2, 2, 2), np.float32)})


def test_feeds_with_wrong_shape_or_unknown_name_are_refused(spec_model):
    with pytest.raises(FeedError, match=r"feed 'X': expected float32 \[1, 1, 4, 4\], got float32 \[4, 4\]"):
        spec_model.gradient("Y", ["W", "Z"], ["X"], feeds={"X": np.zeros((4, 4), np.float32)})
    with pytest.raises(FeedError, match="feed 'Q' names no tensor"):
        spec_model.run({"Q": np.zeros(1)})


def test_gradient_node_input_count_must_match_xs_and_zs():
    m = spec_conv_gemm()
    del m.graph.node[-1].input[-1]
    with pytest.raises(SelectionError, match="has 2 inputs but xs and zs name 3"):
        engine.load(m)


def test_unsupported_op_loads_and_fails_at_run_with_name_op_opset_in_one_line():
    g = helper.make_graph([helper.make_node("FancyOp", ["A"], ["B"], name="mine")], "g",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("B", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = engine.load(m, check=False)
    assert list(model.unsupported_nodes()) == [0]
    with pytest.raises(UnsupportedOpError) as err:
        model.run({"A": np.ones(1, np.float32)})
    msg = str(err.value)
    assert "node 'mine'" in msg and "FancyOp" in msg and "opset 17" in msg and "onnxgrad ops" in msg
    assert len(msg) < 200 and "\n" not in msg


def test_initializer_that_is_a_graph_input_is_an_overridable_default():
    model = engine.load(spec_models.with_initializer([1, 2, 3]))
    x = np.array([1, 1, 1], np.float32)
    np.testing.assert_array_equal(model.run({"X": x})["Y"], [1, 2, 3])
    np.testing.assert_array_equal(model.run({"X": x, "K": np.array([5, 5, 5], np.float32)})["Y"], [5, 5, 5])
    res = model.gradient("Y", ["X"], feeds={"X": x, "K": np.array([7, 8, 9], np.float32)})
    np.testing.assert_array_equal(res.grads["X"], [7, 8, 9])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 2**31 - 1))
def test_non_scalar_y_seed_is_ones_or_dy(shape, seed):
    model = engine.load(spec_models.fan_out())
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    dy = rng.standard_normal((3, 4))
    res_ones = model.gradient("Y", ["A", "B"], feeds={"A": a, "B": b}, dtype="float64")
    res_dy = model.gradient("Y", ["A", "B"], feeds={"A": a, "B": b}, dy=dy, dtype="float64")
    A, B = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    p = A * B
    y = (torch.tanh(p) + torch.sigmoid(p)) * p
    ga, gb = torch.autograd.grad(y.sum(), [A, B], retain_graph=True)
    da, db = torch.autograd.grad(y, [A, B], torch.tensor(dy))
    np.testing.assert_allclose(res_ones.grads["A"], ga.numpy(), rtol=1e-12)
    np.testing.assert_allclose(res_ones.grads["B"], gb.numpy(), rtol=1e-12)
    np.testing.assert_allclose(res_dy.grads["A"], da.numpy(), rtol=1e-12)
    np.testing.assert_allclose(res_dy.grads["B"], db.numpy(), rtol=1e-12)
    assert res_dy.seed == "dy" and res_ones.seed == "ones"


def test_dy_with_wrong_shape_is_refused():
    model = engine.load(spec_models.fan_out())
    with pytest.raises(FeedError, match=r"dy has shape \(2,\) but y 'Y' has shape \(3, 4\)"):
        model.gradient("Y", ["A"], ["B"], dy=np.zeros(2, np.float32))


def test_prepared_gradient_is_reusable_and_supports_higher_order():
    model = engine.load(spec_models.fan_out())
    prepared = model.prepare_gradient("Y", ["A"], ["B"], dtype="float64")
    assert model.prepare_gradient("Y", ["A"], ["B"], dtype="float64") is prepared
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64)
    out = prepared(a, b, create_graph=True)
    (hvp,) = torch.autograd.grad(out.grads[0].sum(), [a])
    A = a.detach().clone().requires_grad_()
    p = A * b
    y = (torch.tanh(p) + torch.sigmoid(p)) * p
    (g,) = torch.autograd.grad(y.sum(), [A], create_graph=True)
    (want,) = torch.autograd.grad(g.sum(), [A])
    torch.testing.assert_close(hvp, want)


@pytest.mark.cuda
def test_gradient_on_cuda_matches_cpu():
    model = engine.load(spec_conv_gemm())
    cpu = model.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds())
    gpu = model.gradient("Y", ["W", "Z"], ["X"], feeds=default_feeds(), device="cuda")
    assert gpu.device.startswith("cuda")
    for n in cpu.grads:
        np.testing.assert_allclose(gpu.grads[n], cpu.grads[n], rtol=1e-4, atol=1e-5)
