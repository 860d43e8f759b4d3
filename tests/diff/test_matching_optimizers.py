"""Tensor matching against what optimizers make of a model: onnxruntime's fused spans, folded constants,
merged duplicates, removed identities, restructured regions; and matching by value where the caller
ran both models. onnxruntime's optimized files and its runs are the oracle."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.modeldiff.matching import match
from engine.modelfile.index import index

from .test_matching import RNG, _model, _vi, _w

# --- onnxruntime's fused spans ---------------------------------------------------------------------

def layernorm_gelu_model(d=16):
    """x -> LayerNorm (decomposed) -> MatMul + bias -> Gelu (erf form) -> + residual: the patterns
    onnxruntime's extended optimizer fuses (LayerNormalization, BiasGelu / Gelu)."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1, name="ln_mean"),
        n("Sub", ["x", "mu"], ["xc"], name="ln_sub"),
        n("Pow", ["xc", "two"], ["sq"], name="ln_pow"),
        n("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1, name="ln_var"),
        n("Add", ["var", "eps"], ["vare"], name="ln_eps"),
        n("Sqrt", ["vare"], ["sd"], name="ln_sqrt"),
        n("Div", ["xc", "sd"], ["xn"], name="ln_div"),
        n("Mul", ["xn", "gamma"], ["xg"], name="ln_scale"),
        n("Add", ["xg", "beta"], ["ln"], name="ln_shift"),
        n("MatMul", ["ln", "w"], ["h"], name="fc"),
        n("Add", ["h", "bias"], ["hb"], name="fc_bias"),
        n("Div", ["hb", "sqrt2"], ["hd"], name="gelu_div"),
        n("Erf", ["hd"], ["he"], name="gelu_erf"),
        n("Add", ["he", "one"], ["he1"], name="gelu_add1"),
        n("Mul", ["hb", "he1"], ["hm"], name="gelu_mul"),
        n("Mul", ["hm", "half"], ["g"], name="gelu_half"),
        n("Add", ["g", "x"], ["y"], name="residual"),
    ]
    inits = [c("two", 2.0), c("eps", 1e-5), _w("gamma", d), _w("beta", d), _w("w", d, d), _w("bias", d),
             c("sqrt2", np.sqrt(2.0)), c("one", 1.0), c("half", 0.5)]
    return _model(nodes, inits, [_vi("x", 2, 3, d)], [_vi("y", 2, 3, d)], opset=13)


def test_onnxruntime_fused_spans_are_matched_at_their_boundary(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    a = layernorm_gelu_model()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(a.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    b = onnx.load(str(tmp_path / "fused.onnx"))
    b_ops = {n.op_type for n in b.graph.node}
    assert "LayerNormalization" in b_ops and b_ops & {"Gelu", "BiasGelu", "FastGelu"}
    ga, gb = index(a), index(b)
    m = match(ga, gb)
    covered = {n for s in m.spans for n in s.a_nodes} | set(m.nodes)
    assert covered == set(ga.node_names)  # every node of A is matched, alone or in a span
    ln = next(s for s in m.spans if "ln_mean" in s.a_nodes)
    assert ln.outputs == ("ln",) and "x" in ln.inputs
    assert set(ln.a_nodes) == {nm for nm in ga.node_names if nm.startswith("ln_")}
    gelu = next(s for s in m.spans if "gelu_erf" in s.a_nodes)
    assert gelu.outputs == ("g",)
    for s in m.spans:
        fused = [gb.nodes[gb.node_names.index(j)] for j in s.b_nodes]
        b_outs = {o for nd in fused for o in nd.output}
        for t in s.outputs:
            assert m.tensors[t] in b_outs  # the fused node's outputs are the span's outputs
        for t in s.inputs:
            if t not in ga.initializers:
                assert t in m.tensors  # every computed boundary input is matched
    assert not [u for u in m.unmatched if u.side == "b"]


# --- what optimizers do besides fusing --------------------------------------------------------------

def test_optimizer_folding_merging_and_removal_are_matched_by_position():
    """onnxruntime folds a computed shape into an initializer, merges duplicate Unsqueezes and drops a Div
    by 1; A's tensors map to the B tensors holding their values, the folded ones are listed as such."""
    n = helper.make_node
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    a_nodes = [n("Shape", ["x"], ["sh"], name="shape"), n("Gather", ["sh", "i0"], ["d0"], name="gather"),
               n("Unsqueeze", ["d0", "ax"], ["u1"], name="unsq1"), n("Unsqueeze", ["d0", "ax"], ["u2"], name="unsq2"),
               n("Concat", ["u1", "u2", "m1"], ["shape2"], axis=0, name="concat"),
               n("Reshape", ["x", "shape2"], ["r"], name="reshape"),
               n("Div", ["r", "one"], ["rd"], name="div1"), n("Relu", ["rd"], ["y"], name="relu"),
               n("Cast", ["u1"], ["u1f"], to=TensorProto.FLOAT, name="castu1"),
               n("Cast", ["u2"], ["u2f"], to=TensorProto.FLOAT, name="castu2"),
               n("Add", ["u1f", "u2f"], ["y2"], name="add")]
    a_inits = [i64("i0", 0), i64("ax", [0]), i64("m1", [-1]), numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    outs = [_vi("y", 2, 2, -1), _vi("y2", 1)]
    a = _model(a_nodes, a_inits, [_vi("x", 2, 6)], outs)
    b_nodes = [n("Reshape", ["x", "folded_shape"], ["r"], name="reshape"), n("Relu", ["r"], ["y"], name="relu"),
               n("Shape", ["x"], ["sh"], name="shape"), n("Gather", ["sh", "i0"], ["d0"], name="gather"),
               n("Unsqueeze", ["d0", "ax"], ["u2"], name="unsq2"),
               n("Cast", ["u2"], ["u1f"], to=TensorProto.FLOAT, name="castu1"),
               n("Add", ["u1f", "u1f"], ["y2"], name="add")]
    b_inits = [i64("folded_shape", [2, 2, -1]), i64("i0", 0), i64("ax", [0])]
    b = _model(b_nodes, b_inits, [_vi("x", 2, 6)], outs)
    m = match(index(a), index(b))
    assert m.tensors["shape2"] == "folded_shape"
    assert m.tensors["rd"] == "r" and m.tensors["r"] == "r"  # the Div by 1 that B dropped
    assert m.tensors["u1"] == m.tensors["u2"] == "u2"  # the Unsqueezes B merged
    assert m.tensors["u2f"] == "u1f" and m.tensors["y2"] == "y2"  # so the Casts of both are B's one Cast
    whys = {u.tensor: u.why for u in m.unmatched}
    assert set(whys) == {"m1", "one"}
    assert "folded" in whys["m1"] or "constants" in whys["m1"]
    assert "div1" in whys["one"]
    assert m.spans == () and not [u for u in m.unmatched if u.side == "b"]


def test_a_node_matched_by_its_output_matches_its_inputs_too():
    """B computes Gemm's value as MatMul + Add under other names; the Relu after it is matched by the graph
    output, and from it the walk back finds the span's boundary."""
    n = helper.make_node
    a = _model([n("Gemm", ["x", "w", "bias"], ["h"], name="gemm"), n("Relu", ["h"], ["y"], name="relu")],
               [_w("w", 4, 3), _w("bias", 3)], [_vi("x", 2, 4)], [_vi("y", 2, 3)])
    b = _model([n("MatMul", ["x", "w"], ["mm"], name="mm"), n("Add", ["mm", "bias"], ["fc_out"], name="add"),
                n("Relu", ["fc_out"], ["out"], name="act")],
               [_w("w", 4, 3), _w("bias", 3)], [_vi("x", 2, 4)], [_vi("out", 2, 3)])
    m = match(index(a), index(b))
    assert m.tensors == {"x": "x", "w": "w", "bias": "bias", "h": "fc_out", "y": "out"}
    assert [(s.a_nodes, s.b_nodes, s.outputs) for s in m.spans] == [(("gemm",), ("mm", "add"), ("h",))]
    assert m.nodes == {"relu": "act"} and m.unmatched == ()


def _every_value(model, feeds):
    """Every node output of `model` on `feeds`, run by onnxruntime (the independent oracle)."""
    ort = pytest.importorskip("onnxruntime")
    full = onnx.ModelProto()
    full.CopyFrom(model)
    known = {o.name for o in full.graph.output}
    full.graph.output.extend(onnx.ValueInfoProto(name=t) for n in full.graph.node for t in n.output
                             if t and t not in known)
    sess = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def test_values_match_what_names_and_position_cannot():
    """B spells Relu as Max(h, 0) under other names and has an extra output, so nothing structural pairs
    A's Relu and Tanh outputs; their values (run by onnxruntime) do, and the walk goes on from there."""
    n = helper.make_node
    a = _model([n("MatMul", ["x", "w"], ["h"], name="mm"), n("Relu", ["h"], ["r"], name="relu"),
                n("Tanh", ["r"], ["y"], name="tanh"), n("Sigmoid", ["y"], ["y2"], name="sig")],
               [_w("w", 4, 6)], [_vi("x", 5, 4)], [_vi("y2", 5, 6)])
    b = _model([n("MatMul", ["x", "w"], ["h"], name="mm"), n("Max", ["h", "zero"], ["m"], name="max"),
                n("Tanh", ["m"], ["t"], name="th"), n("Sigmoid", ["t"], ["out"], name="sg"),
                n("Neg", ["x"], ["extra"], name="neg")],
               [_w("w", 4, 6), numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
               [_vi("x", 5, 4)], [_vi("out", 5, 6), _vi("extra", 5, 4)])
    b.graph.initializer[0].CopyFrom(a.graph.initializer[0])
    ga, gb = index(a), index(b)
    plain = match(ga, gb)
    assert "r" not in plain.tensors and "y" not in plain.tensors
    feeds = {"x": RNG.standard_normal((5, 4)).astype(np.float32)}
    m = match(ga, gb, values=(_every_value(a, feeds), _every_value(b, feeds)))
    assert m.tensors == {"x": "x", "w": "w", "h": "h", "r": "m", "y": "t", "y2": "out"}
    assert [(s.a_nodes, s.b_nodes) for s in m.spans] == [(("relu",), ("max",))]
    assert m.nodes == {"mm": "mm", "tanh": "th", "sig": "sg"}


def test_onnxruntime_transformers_optimizer_on_a_vit_block(tmp_path):
    """The transformers optimizer fuses the block's GELU and drops the exporter's Identity before the
    output: the GELU is a span, the Identity's input is B's output, and nothing else is left over."""
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    from tests.fusion_models import vit_block

    a = vit_block()
    a = a[0] if isinstance(a, tuple) else a
    path = tmp_path / "vit.onnx"
    onnx.save(a, str(path))
    b = optimizer.optimize_model(str(path), model_type="bert", num_heads=2, hidden_size=8, opt_level=1).model
    ga, gb = index(a), index(b)
    m = match(ga, gb)
    gelus = [s for s in m.spans if any(gb.nodes[gb.node_names.index(j)].op_type in ("Gelu", "FastGelu", "BiasGelu")
                                       for j in s.b_nodes)]
    assert len(gelus) == 1 and any("Erf" == ga.nodes[ga.node_names.index(n)].op_type for n in gelus[0].a_nodes)
    assert all(t in m.tensors for s in m.spans for t in s.outputs)
    assert not [u for u in m.unmatched if not u.why.startswith(("inside a span", "a constant read only"))]
    covered = {n for s in m.spans for n in s.a_nodes} | set(m.nodes)
    left = [n for n in ga.node_names if n not in covered]
    assert all(ga.nodes[ga.node_names.index(n)].op_type == "Identity" for n in left)
