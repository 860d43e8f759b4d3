"""What onnxruntime's optimizers do to real exports, in miniature: two Reshapes merged into one, a chain of
float Casts dropped. Found on GPT-2 and Llama exports (benchmarks/bench_diff_targets.py): the gradient
flowing into the tensor B does not hold was compared with nothing (a false divergence of 1). The
oracle for "nothing diverges" is that B computes exactly A's function (each case is checked by
onnxruntime first), and the gradient A sends is compared with torch autograd on the same function."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.modeldiff.matching import match
from engine.modelfile.index import index

from .test_matching import _model, _vi

RNG = np.random.default_rng(3)
W = RNG.standard_normal((6, 6)).astype(np.float32)
V = RNG.standard_normal((2, 6, 6)).astype(np.float32)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def reshapes(merged: bool):
    """x (2,3,4) -> Transpose -> Reshape (2,12) -> Reshape (4,6) -> MatMul W -> y; merged: one Reshape
    straight to (4,6) under the second's output name, as onnxruntime's Reshape fusion writes it."""
    n = helper.make_node
    shapes = [_init("s2", np.array([4, 6], np.int64)), _init("w", W)]
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="transpose")]
    if merged:
        nodes.append(n("Reshape", ["t", "s2"], ["r2"], name="reshape_merged"))
    else:
        shapes.append(_init("s1", np.array([2, 12], np.int64)))
        nodes += [n("Reshape", ["t", "s1"], ["r1"], name="reshape1"), n("Reshape", ["r1", "s2"], ["r2"], name="reshape2")]
    nodes.append(n("MatMul", ["r2", "w"], ["y"], name="mm"))
    return _model(nodes, shapes, [_vi("x", 2, 3, 4)], [_vi("y", 4, 6)])


def test_two_reshapes_merged_into_one_are_a_span_and_nothing_diverges():
    a, b = reshapes(False), reshapes(True)
    np.testing.assert_array_equal(_ort(a, {"x": X}), _ort(b, {"x": X}))  # B computes A's function
    m = match(index(a), index(b))
    assert [(s.a_nodes, s.b_nodes) for s in m.spans] == [(("reshape1", "reshape2"), ("reshape_merged",))]
    r = engine.diff(a, b, y="y", xs=["x"], feeds={"x": X})
    assert not r.diverges, r.worst()[:2]
    grads = [n for n in r.nodes if n.where == "gradient"]
    assert {n.node for n in grads} == {"mm", "reshape1", "transpose"}  # the span is one gradient row
    assert all(n.local_error == 0.0 for n in grads)  # a Reshape sends its gradient back exactly


def casts(dropped: bool):
    """Attention's tail: y = Cast(Cast(Softmax(x W))) @ V, the two float Casts a torchscript export writes
    after Softmax; dropped: what onnxruntime's optimizer leaves (Softmax straight into the MatMul)."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["s"], name="scores"), n("Softmax", ["s"], ["p"], axis=-1, name="softmax")]
    if dropped:
        nodes.append(n("MatMul", ["p", "v"], ["y"], name="context"))
    else:
        nodes += [n("Cast", ["p"], ["c1"], to=TensorProto.FLOAT, name="cast1"),
                  n("Cast", ["c1"], ["c2"], to=TensorProto.FLOAT, name="cast2"),
                  n("MatMul", ["c2", "v"], ["y"], name="context")]
    return _model(nodes, [_init("w", W), _init("v", V)], [_vi("x", 2, 6, 6)], [_vi("y", 2, 6, 6)])


def test_a_chain_of_casts_b_dropped_sends_its_gradient_through_unchanged():
    x = RNG.standard_normal((2, 6, 6)).astype(np.float32)
    a, b = casts(False), casts(True)
    np.testing.assert_array_equal(_ort(a, {"x": x}), _ort(b, {"x": x}))
    m = match(index(a), index(b))
    assert m.tensors["c1"] == m.tensors["c2"] == "p"  # both links of the chain hold B's Softmax output
    r = engine.diff(a, b, y="y", xs=["x"], feeds={"x": x})
    assert not r.diverges, r.worst()[:2]
    rows = {(n.node, n.where): n for n in r.nodes}
    for cast in ("cast1", "cast2"):
        assert rows[(cast, "gradient")].local_error == 0.0 and rows[(cast, "gradient")].b_nodes == ()
        assert "B does without it" in rows[(cast, "forward")].note
    # what A sends into x is torch autograd's gradient of sum(y) (the rows compare against it)
    xt = torch.tensor(x, requires_grad=True)
    (torch.softmax(xt @ torch.tensor(W), -1) @ torch.tensor(V)).sum().backward()
    got = engine.load(a).gradient("y", ["x"], [], {"x": x}).grads["x"]
    np.testing.assert_allclose(np.asarray(got), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


GAMMA = (1 + 0.3 * RNG.standard_normal(6)).astype(np.float32)
BETA = (0.1 * RNG.standard_normal(6)).astype(np.float32)


def skip_norm(fused: bool):
    """s = x + r; n = LayerNorm(s); y = 2n + s. Fused: onnxruntime's SkipLayerNormalization computes n
    and the sum s at once, and B doubles n as n + n, so n has no counterpart: the span reaching back from
    B's Add takes in the SkipLayerNormalization, which computes s on the way."""
    n = helper.make_node
    inits = [_init("gamma", GAMMA), _init("beta", BETA)]
    if fused:
        nodes = [n("SkipLayerNormalization", ["x", "r", "gamma", "beta"], ["n_b", "", "", "s"], epsilon=1e-5,
                   domain="com.microsoft", name="skip_ln"),
                 n("Add", ["n_b", "n_b"], ["twice_b"], name="double_b")]
    else:
        inits.append(_init("two", np.float32(2.0)))
        nodes = [n("Add", ["x", "r"], ["s"], name="residual"),
                 n("LayerNormalization", ["s", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5, name="ln"),
                 n("Mul", ["n", "two"], ["twice_b"], name="double")]
    nodes.append(n("Add", ["twice_b", "s"], ["y"], name="out"))
    return _model(nodes, inits, [_vi("x", 2, 3, 6), _vi("r", 2, 3, 6)], [_vi("y", 2, 3, 6)], ms=fused)


def test_a_span_that_computes_a_matched_value_on_the_way_takes_its_producer_in_a_too():
    feeds = {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32),
             "r": RNG.standard_normal((2, 3, 6)).astype(np.float32)}
    a, b = skip_norm(False), skip_norm(True)
    np.testing.assert_allclose(_ort(a, feeds), _ort(b, feeds), rtol=1e-5, atol=1e-5)
    m = match(index(a), index(b))
    assert [(s.a_nodes, s.b_nodes, set(s.inputs)) for s in m.spans] == [
        (("residual", "ln", "double"), ("skip_ln", "double_b"), {"x", "r", "gamma", "beta", "two"})]
    r = engine.diff(a, b, y="y", xs=["x"], zs=["r"], feeds=feeds)
    assert not r.diverges, r.worst()[:2]
    assert {n.node for n in r.nodes if n.where == "gradient"} == {"out", "residual"}  # the span is named by its first node


def test_constants_b_computes_for_a_fused_node_alone_are_part_of_its_span():
    """B divides by a half it computes from two constants (as the transformers optimizer reduces a mask
    index for its Attention): that arithmetic belongs to the span, it is not a B value A lacks."""
    n = helper.make_node
    a = _model([n("Mul", ["x", "two"], ["h"], name="double"), n("Relu", ["h"], ["y"], name="relu")],
               [_init("two", np.float32(2.0))], [_vi("x", 3, 4)], [_vi("y", 3, 4)])
    b = _model([n("Div", ["one", "two_b"], ["half"], name="half"), n("Div", ["x", "half"], ["t"], name="by_half"),
                n("Relu", ["t"], ["y"], name="relu")],
               [_init("one", np.float32(1.0)), _init("two_b", np.float32(2.0))], [_vi("x", 3, 4)], [_vi("y", 3, 4)])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(_ort(a, {"x": x}), _ort(b, {"x": x}))
    m = match(index(a), index(b))
    assert [(s.a_nodes, s.b_nodes) for s in m.spans] == [(("double",), ("by_half",))]
    assert not [u for u in m.unmatched if u.side == "b"]
    assert not engine.diff(a, b, y="y", xs=["x"], feeds={"x": x}).diverges


def test_a_shape_b_folded_into_another_spelling_is_compared_where_it_is_read():
    """A computes Reshape's target [batch, -1] from Shape; the transformers optimizer writes the constant
    [0, -1] (0: keep that dim). Both reshape alike: the Concat is not a divergence, the Reshape is compared."""
    n = helper.make_node
    i64 = lambda name, v: _init(name, np.array(v, np.int64))  # noqa: E731
    a = _model([n("Shape", ["x"], ["sh"], name="shape"), n("Gather", ["sh", "zero"], ["d0"], axis=0, name="batch"),
                n("Unsqueeze", ["d0", "ax"], ["d0u"], name="unsq"),
                n("Concat", ["d0u", "minus1"], ["target"], axis=0, name="concat"),
                n("Reshape", ["x", "target"], ["r"], name="reshape"), n("Tanh", ["r"], ["y"], name="tanh")],
               [i64("zero", 0), i64("ax", [0]), i64("minus1", [-1])], [_vi("x", 2, 3, 4)], [_vi("y", 2, 12)])
    b = _model([n("Reshape", ["x", "target_folded"], ["r"], name="reshape"), n("Tanh", ["r"], ["y"], name="tanh")],
               [i64("target_folded", [0, -1])], [_vi("x", 2, 3, 4)], [_vi("y", 2, 12)])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(_ort(a, {"x": x}), _ort(b, {"x": x}))
    assert match(index(a), index(b)).tensors["target"] == "target_folded"
    r = engine.diff(a, b, y="y", xs=["x"], feeds={"x": x})
    assert not r.diverges, r.worst()[:2]
    assert {n.node for n in r.nodes if n.where == "forward"} == {"reshape", "tanh"}


def test_a_merged_reshape_does_not_pair_inputs_of_other_shapes():
    """A: MatMul + Add on (2,3,4), then Reshape; B (onnxruntime's MatMulAddFusion): Reshape to (6,4), Gemm,
    and one Reshape to A's target under its output name. The walk back from that Reshape must not pair A's
    3-D Add with B's 2-D Gemm output (the gradient crashed on the shapes); the three are one span."""
    n = helper.make_node
    w, bias = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    i64 = lambda name, v: _init(name, np.array(v, np.int64))  # noqa: E731
    a = _model([n("MatMul", ["x", "w"], ["h"], name="mm"), n("Add", ["h", "bias"], ["hb"], name="add"),
                n("Reshape", ["hb", "target"], ["r"], name="reshape"), n("Tanh", ["r"], ["y"], name="tanh")],
               [_init("w", w), _init("bias", bias), i64("target", [2, 3, 2, 3])], [_vi("x", 2, 3, 4)],
               [_vi("y", 2, 3, 2, 3)])
    b = _model([n("Reshape", ["x", "flat"], ["x2"], name="in_reshape"), n("Gemm", ["x2", "w", "bias"], ["g"], name="gemm"),
                n("Reshape", ["g", "target_b"], ["r"], name="out_reshape"), n("Tanh", ["r"], ["y"], name="tanh")],
               [_init("w", w), _init("bias", bias), i64("flat", [6, 4]), i64("target_b", [2, 3, 2, 3])],
               [_vi("x", 2, 3, 4)], [_vi("y", 2, 3, 2, 3)])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_ort(a, {"x": x}), _ort(b, {"x": x}), rtol=1e-6, atol=1e-6)
    m = match(index(a), index(b))
    assert "hb" not in m.tensors
    assert [(s.a_nodes, s.b_nodes) for s in m.spans] == [(("mm", "add", "reshape"), ("in_reshape", "gemm", "out_reshape"))]
    assert not engine.diff(a, b, y="y", xs=["x"], feeds={"x": x}).diverges


def test_spans_that_share_a_b_node_become_one():
    """B splits x in two and doubles / triples each half with Adds where A slices and multiplies: the
    second span found reaches B's Split, which the first took; taken in, both sides read x."""
    n = helper.make_node
    i64 = lambda name, v: _init(name, np.array(v, np.int64))  # noqa: E731
    a = _model([n("Slice", ["x", "s0", "e0", "ax"], ["a1"], name="slice1"), n("Mul", ["a1", "two"], ["o1"], name="double"),
                n("Slice", ["x", "e0", "e1", "ax"], ["a2"], name="slice2"), n("Mul", ["a2", "three"], ["o2"], name="triple")],
               [i64("s0", [0]), i64("e0", [2]), i64("e1", [4]), i64("ax", [0]), _init("two", np.float32(2.0)),
                _init("three", np.float32(3.0))], [_vi("x", 4, 6)], [_vi("o1", 2, 6), _vi("o2", 2, 6)])
    b = _model([n("Split", ["x", "halves"], ["u1", "u2"], axis=0, name="split"),
                n("Add", ["u1", "u1"], ["o1"], name="add1"), n("Add", ["u2", "u2"], ["t2"], name="add2"),
                n("Add", ["t2", "u2"], ["o2"], name="add3")],
               [i64("halves", [2, 2])], [_vi("x", 4, 6)], [_vi("o1", 2, 6), _vi("o2", 2, 6)])
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(_ort(a, {"x": x}), _ort(b, {"x": x}))
    m = match(index(a), index(b))
    assert [(set(s.a_nodes), set(s.b_nodes), "x" in s.inputs) for s in m.spans] == [
        ({"slice1", "double", "slice2", "triple"}, {"split", "add1", "add2", "add3"}, True)]
    r = engine.diff(a, b, y="o1", xs=["x"], feeds={"x": x})
    assert not r.diverges, r.worst()[:2]


def test_a_scale_a_computes_from_shapes_and_b_folded_gets_no_gradient_row():
    """A scales x by sqrt(its last dim), computed from Shape (as torchscript writes attention's scale);
    B multiplies by the folded constant. No gradient flows into B's constant: the Mul's gradient is
    compared at x only."""
    n = helper.make_node
    a = _model([n("Shape", ["x"], ["sh"], name="shape"), n("Gather", ["sh", "last"], ["d"], axis=0, name="dim"),
                n("Cast", ["d"], ["df"], to=TensorProto.FLOAT, name="cast"), n("Sqrt", ["df"], ["sc"], name="sqrt"),
                n("Mul", ["x", "sc"], ["h"], name="scale"), n("Tanh", ["h"], ["y"], name="tanh")],
               [_init("last", np.array(1, np.int64))], [_vi("x", 3, 4)], [_vi("y", 3, 4)])
    b = _model([n("Mul", ["x", "sc_folded"], ["h"], name="scale"), n("Tanh", ["h"], ["y"], name="tanh")],
               [_init("sc_folded", np.float32(2.0))], [_vi("x", 3, 4)], [_vi("y", 3, 4)])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(_ort(a, {"x": x}), _ort(b, {"x": x}))
    r = engine.diff(a, b, y="y", xs=["x"], feeds={"x": x})
    assert not r.diverges, r.worst()[:2]
    assert {n.node for n in r.nodes if n.where == "gradient"} == {"tanh", "scale"}
