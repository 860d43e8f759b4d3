"""What real exporters do that lowering must survive, each in a small hand-built model run by onnxruntime
against the engine: If branches that reuse tensor names (optimum's merged decoders), Resize whose
output size static inference lost or that is computed at run time (diffusers UNets, NNSmith), and
float16 through ReduceMax/Min ties and guarded divisions."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine
from tests.lowering_checks import assert_close, check_valid, ort_run

pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _matches_engine(model, y, xs, zs, feeds_list, tol=None):
    lowered = engine.lower(model, y, xs, zs, dy=True)
    check_valid(lowered)
    m = engine.load(model)
    for k, feeds in enumerate(feeds_list):
        out = m.run(feeds)[y]
        dy = np.random.default_rng(k).standard_normal(out.shape).astype(out.dtype)
        want = m.gradient(y, xs, zs, feeds=feeds, dy=dy).grads
        got = ort_run(lowered, {**feeds, f"d{y}": dy})
        assert all(np.isfinite(got[f"d{y}_d{x}"]).all() for x in xs)
        assert_close(got, {f"d{y}_d{x}": g for x, g in want.items()}, tol)
    return lowered


def _branch(name: str, start: int, op: str, prefix: str = "") -> onnx.GraphProto:
    """o = x op ConstantOfShape(Shape(x)[start:]): rank 1 or 3 for the same names s, c, o."""
    s, c, o = (prefix + n for n in "sco")
    ones = numpy_helper.from_array(np.full(1, 2.0, np.float32))
    nodes = [helper.make_node("Shape", ["x"], [s], start=start), helper.make_node("ConstantOfShape", [s], [c], value=ones),
             helper.make_node(op, ["x", c], [o])]
    return helper.make_graph(nodes, name, [], [vi(o, F, [2, 3, 4])])


@pytest.mark.parametrize("distinct", [False, True])
def test_if_branches_reusing_names_lower(distinct):
    """optimum's merged decoders: both branches define the same names with other ranks; onnx's data propagation
    leaked one branch's shapes into the other, and the lowered model failed the full check."""
    then_g, else_g = _branch("then", -1, "Mul", "t_" if distinct else ""), _branch("else", 0, "Add")
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["v"], ["x"]), helper.make_node("If", ["cond"], ["y"], then_branch=then_g,
                                                                  else_branch=else_g, name="optimum::if")],
        "merged", [vi("v", F, [2, 3, 4]), vi("cond", TensorProto.BOOL, [])], [vi("y", F, [2, 3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    v = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    lowered = _matches_engine(model, "y", ["v"], ["cond"], [{"v": v, "cond": np.array(c)} for c in (True, False)])
    assert [o.name for o in lowered.graph.output] == ["y", "dy_dv"]


def _resize_model(mode: str, how: str) -> onnx.ModelProto:
    """y = Resize(x / 2) on symbolic dims (static inference knows no size): by constant scales, by sizes computed
    from x's shape (Shape, Slice, Mul, Ceil, Concat: NNSmith's and the exporters' pattern)."""
    scales = numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 0.5], np.float32), "scales")
    nodes = [helper.make_node("Div", ["x", "two"], ["half"]),
             helper.make_node("Shape", ["x"], ["lead"], end=2), helper.make_node("Shape", ["x"], ["hw"], start=2),
             helper.make_node("Cast", ["hw"], ["hw_f"], to=F), helper.make_node("Mul", ["hw_f", "factor"], ["hw_s"]),
             helper.make_node("Ceil", ["hw_s"], ["hw_c"]), helper.make_node("Cast", ["hw_c"], ["hw_i"], to=TensorProto.INT64),
             helper.make_node("Concat", ["lead", "hw_i"], ["sizes"], axis=0)]
    operands = {"scales": ["", "scales"], "sizes": ["", "", "sizes"]}[how]
    nodes.append(helper.make_node("Resize", ["half", *operands], ["y"], mode=mode, name="up"))
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"), scales,
             numpy_helper.from_array(np.array([1.5, 0.75], np.float32), "factor")]
    graph = helper.make_graph(nodes, "resize", [vi("x", F, ["N", "C", "H", "W"])], [vi("y", F, ["N", "C", "H2", "W2"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("how", ["scales", "sizes"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_without_static_sizes(mode, how):
    """The Resize backward builds its per-axis matrices at run time: one lowered file serves two input sizes."""
    model = _resize_model(mode, how)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in [(1, 2, 3, 4), (2, 1, 5, 6)]]
    _matches_engine(model, "y", ["x"], [], feeds)


H = TensorProto.FLOAT16


def _half_matches_engine(nodes, x_shape, y_shape, x, inits=(), opset=17):
    """y = nodes(x) in float16, lowered, run by onnxruntime without graph optimizations (where its float16
    kernels are taken as written): finite wherever the engine's float16 gradient is, and close to it."""
    graph = helper.make_graph(nodes, "half", [vi("x", H, x_shape)], [vi("y", H, y_shape)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    lowered = engine.lower(model, "y", ["x"], [], dy=True)
    check_valid(lowered)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(lowered.SerializeToString(), options, providers=["CPUExecutionProvider"])
    m = engine.load(model)
    dy = np.random.default_rng(2).standard_normal(m.run({"x": x})["y"].shape).astype(np.float16)
    got = session.run(["dy_dx"], {"x": x, "dy": dy})[0]
    want = np.asarray(m.gradient("y", ["x"], [], feeds={"x": x}, dy=dy).grads["x"])
    assert np.isfinite(want).all() and np.isfinite(got).all()
    got, want = got.astype(np.float64), want.astype(np.float64)  # relative: a gradient of 1e-5 counts too
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


def test_half_reduce_max_after_resize_is_not_nan():
    """NNSmith's float16 graph: Cos, a linear Resize, ReduceMax over a size-1 axis. onnxruntime without graph
    optimizations compared the expanded max unequal to every element, so the tie share was 0/0."""
    sizes = numpy_helper.from_array(np.array([19, 1, 35, 1, 1], np.int64), "sizes")
    nodes = [helper.make_node("Cos", ["x"], ["c"]), helper.make_node("Resize", ["c", "", "", "sizes"], ["r"], mode="linear"),
             helper.make_node("ReduceMax", ["r"], ["y"], axes=[4], keepdims=0)]
    x = np.random.default_rng(3).standard_normal((19, 1, 1, 1, 1)).astype(np.float16)
    _half_matches_engine(nodes, [19, 1, 1, 1, 1], [19, 1, 35, 1], x, [sizes])


def test_half_gelu_tanh_of_large_inputs_is_finite():
    """x³ overflows float16 from |x| > 40; the derivative there is 0 or 1, which the float32 intermediates give."""
    x = np.array([-300.0, -50.0, -3.0, 0.0, 0.5, 3.0, 50.0, 300.0], np.float16)
    _half_matches_engine([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], [8], [8], x, opset=20)


@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
def test_half_mean_over_more_than_65504_inputs(op):
    """1/n, not g/n: n = 70,000 is infinite in float16, its reciprocal is not."""
    x = np.random.default_rng(4).standard_normal((1, 1, 70000)).astype(np.float16)
    attrs = {"keepdims": 1} if op == "ReduceMean" else {}
    _half_matches_engine([helper.make_node(op, ["x"], ["y"], **attrs)], [1, 1, 70000], [1, 1, 1], x)


def test_if_whose_dead_branch_has_another_rank():
    """The TorchScript exporter's Squeeze of a dim that may be 1: If(dim == 1) Squeeze else Identity, the
    output declared at the squeezed rank. The backward If's untaken branch sees dy at that rank too."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    then_g = helper.make_graph([helper.make_node("Squeeze", ["t", "axes"], ["s"])], "then", [], [vi("s", F, [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["t"], ["i"])], "else", [], [vi("i", F, [1, 3])])
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Shape", ["t"], ["shape"], end=1),
             helper.make_node("Squeeze", ["shape", "axes"], ["first"]), helper.make_node("Equal", ["first", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "squeeze_if", [vi("x", F, [1, 3])], [vi("y", F, [3])],
                              [axes, numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _matches_engine(model, "y", ["x"], [], [{"x": np.array([[0.1, -0.5, 2.0]], np.float32)}])


def test_conv_with_pads_beyond_a_small_symbolic_input():
    """NNSmith: a 3 x 3 kernel, stride 3, begin pads 4 before a 1 x 1 input of symbolic size. The transposed
    conv that lands on x cropped its begin pads itself, and onnxruntime found its output size <= 0."""
    w = numpy_helper.from_array(np.random.default_rng(5).standard_normal((2, 1, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[3, 3], pads=[4, 4, 0, 0])
    graph = helper.make_graph([node], "conv", [vi("x", F, ["N", 1, "H", "W"])], [vi("y", F, ["N", 2, "P", "Q"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in [(1, 1, 1, 1), (2, 1, 4, 5)]]
    _matches_engine(model, "y", ["x", "w"], [], feeds)


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceMean"])
def test_reduce_of_a_tensor_of_unknown_rank(op):
    """Reshape to a shape fed at run time: shape inference knows no rank, so the reduction's axes are used as
    written and the reduced axes restored from a keepdims reduction's shape (NNSmith seed 272, float64)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node(op, ["r"], ["y"], axes=[-1], keepdims=0)]
    graph = helper.make_graph(nodes, "unknown_rank", [vi("x", F, [6]), vi("shape", TensorProto.INT64, ["k"])],
                              [vi("y", F, ["m"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([0.5, -1.0, 2.0, -1.0, 3.0, 0.0], np.float32)  # a tie in the first row
    feeds = [{"x": x, "shape": np.array(s, np.int64)} for s in ([2, 3], [3, 2])]
    _matches_engine(model, "y", ["x"], ["shape"], feeds)


def test_half_reduce_l2_of_a_zero_slice_is_zero():
    """At a zero norm the engine (torch's vector_norm) gives 0, not 0/0."""
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]], np.float16)
    _half_matches_engine([helper.make_node("ReduceL2", ["x"], ["y"], axes=[1], keepdims=1)], [2, 3], [2, 1], x)
