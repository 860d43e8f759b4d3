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
