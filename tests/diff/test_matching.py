"""Tensor matching for `onnxgrad diff`: renamed and reordered copies, cast models, QDQ pairs and
onnxruntime's fused spans. The oracle is what the transformation did to each tensor (the rename map,
the converter's inserted Casts), or onnxruntime's own optimized file."""
from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from engine.modeldiff.matching import match
from engine.modelfile.index import index

RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _model(nodes, inits, inputs, outputs, opset=17, ms=None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def _vi(name, *shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def mlp():
    """Two inputs, three same-shaped weights (a renamed copy must tell them apart by value), a Constant
    node and two outputs."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["r1", "w3"], ["h3"], name="mm3"),
        helper.make_node("Constant", [], ["half"], name="c_half",
                         value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Mul", ["h3", "half"], ["m3"], name="mul3"),
        helper.make_node("Add", ["h2", "m3"], ["s"], name="sum"),
        helper.make_node("Mul", ["s", "z"], ["y"], name="gate"),
        helper.make_node("Tanh", ["s"], ["y2"], name="tanh"),
    ]
    inits = [_w("w1", 4, 8), _w("b1", 8), _w("w2", 8, 8), _w("w3", 8, 8)]
    return _model(nodes, inits, [_vi("x", 2, 4), _vi("z", 2, 8)], [_vi("y", 2, 8), _vi("y2", 2, 8)])


def _tensor_names(model):
    g = model.graph
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    names += [t for n in g.node for t in list(n.input) + list(n.output) if t]
    return list(dict.fromkeys(names))


def renamed_reordered(model, seed):
    """Every tensor and node renamed at random, the nodes put in another valid topological order."""
    rnd = random.Random(seed)
    names = _tensor_names(model)
    new = [f"t{k}" for k in range(len(names))]
    rnd.shuffle(new)
    rename = dict(zip(names, new))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for vi in list(g.input) + list(g.output):
        vi.name = rename[vi.name]
    for t in g.initializer:
        t.name = rename[t.name]
    for k, n in enumerate(g.node):
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename[t] for t in n.output]
        n.name = f"n{rnd.randrange(10**6)}_{k}"
    nodes = list(g.node)
    ready = {i.name for i in g.input} | {t.name for t in g.initializer}
    order = []
    while nodes:
        can = [n for n in nodes if all(t in ready for t in n.input if t)]
        pick = rnd.choice(can)
        nodes.remove(pick)
        order.append(pick)
        ready.update(pick.output)
    del g.node[:]
    g.node.extend(order)
    return out, rename


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6))
def test_a_renamed_reordered_copy_is_fully_matched(seed):
    a = mlp()
    b, rename = renamed_reordered(a, seed)
    m = match(index(a), index(b))
    assert m.tensors == rename
    assert m.unmatched == ()
    assert len(m.nodes) == len(a.graph.node)


def test_add_prefix_copy_is_fully_matched():
    a = mlp()
    b = onnx.compose.add_prefix(a, "v2/")
    m = match(index(a), index(b))
    assert m.tensors == {t: "v2/" + t for t in _tensor_names(a)}
    assert m.unmatched == ()


def test_names_are_the_primary_key_even_where_the_producer_differs():
    a = mlp()
    b = onnx.ModelProto()
    b.CopyFrom(a)
    b.graph.node[2].op_type = "LeakyRelu"  # relu1 -> LeakyRelu, same output name
    m = match(index(a), index(b))
    assert m.tensors == {t: t for t in _tensor_names(a)}
    assert [(s.a_nodes, s.b_nodes, s.outputs) for s in m.spans] == [(("relu1",), ("relu1",), ("r1",))]
    assert "relu1" not in m.nodes and m.nodes["mm2"] == "mm2"


def test_twin_branches_are_ambiguous_and_stay_unmatched():
    """Two Muls of x by weights that B changed both, and an extra output in B so that the outputs cannot
    be paired by position: nothing tells which Mul is which."""
    nodes = [helper.make_node("Mul", ["x", "w1"], ["r1"]), helper.make_node("Mul", ["x", "w2"], ["r2"]),
             helper.make_node("Sub", ["r1", "r2"], ["y"])]
    a = _model(nodes, [_w("w1", 3), _w("w2", 3)], [_vi("x", 3)], [_vi("y", 3)])
    b = onnx.compose.add_prefix(a, "b_")
    for t in b.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.5, t.name))
    b.graph.node.append(helper.make_node("Neg", ["b_x"], ["b_extra"]))
    b.graph.output.append(_vi("b_extra", 3))
    m = match(index(a), index(b))
    assert m.tensors == {"x": "b_x"}
    whys = {u.tensor: u.why for u in m.unmatched if u.side == "a"}
    assert set(whys) == {"r1", "r2", "w1", "w2", "y"}
    assert whys["r1"].startswith("ambiguous") and whys["r2"].startswith("ambiguous")
    assert whys["y"].startswith("no Sub node of B")
    assert {u.tensor for u in m.unmatched if u.side == "b"} == {"b_r1", "b_r2", "b_w1", "b_w2", "b_y", "b_extra"}


def test_duplicates_computing_one_value_are_interchangeable():
    """An exporter's repeated Shape of one tensor: either of B's stands for either of A's."""
    nodes = [helper.make_node("Shape", ["x"], ["s1"]), helper.make_node("Shape", ["x"], ["s2"]),
             helper.make_node("Gather", ["s1", "i0"], ["d0"]), helper.make_node("Gather", ["s2", "i1"], ["d1"]),
             helper.make_node("Sub", ["d0", "d1"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i0"), numpy_helper.from_array(np.array(1, np.int64), "i1")]
    a = _model(nodes, inits, [_vi("x", 3, 4)], [_vi("y", elem=TensorProto.INT64)])
    b, rename = renamed_reordered(a, seed=5)
    m = match(index(a), index(b))
    assert {m.tensors["s1"], m.tensors["s2"]} == {rename["s1"], rename["s2"]}
    for t in ("x", "i0", "i1", "d0", "d1", "y"):
        assert m.tensors[t] == rename[t]  # the index constants tell the Gathers apart
    assert m.unmatched == ()


def test_what_b_adds_is_listed_not_guessed():
    a = mlp()
    b = onnx.compose.add_prefix(a, "p_")
    b.graph.node.append(helper.make_node("Sigmoid", ["p_s"], ["extra"], name="extra_sig"))
    b.graph.output.append(_vi("extra", 2, 8))
    m = match(index(a), index(b))
    assert len(m.tensors) == len(_tensor_names(a))
    assert [(u.side, u.tensor, u.producer) for u in m.unmatched] == [("b", "extra", "extra_sig")]
    assert "Sigmoid" in m.unmatched[0].why


# --- cast models -----------------------------------------------------------------------------------

def cast_by_hand(model):
    """onnxconverter-common's keep_io_types style: float initializers and Constants to float16, a Cast
    after each float input and before each output (the producer's output renamed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for t in g.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16)))
    casts = []
    for i in g.input:
        cast = i.name + "_to16"
        for n in g.node:
            n.input[:] = [cast if t == i.name else t for t in n.input]
        casts.append(helper.make_node("Cast", [i.name], [cast], to=TensorProto.FLOAT16, name="cast_" + i.name))
    for o in g.output:
        inner = o.name + "_16"
        for n in g.node:
            n.output[:] = [inner if t == o.name else t for t in n.output]
            n.input[:] = [inner if t == o.name else t for t in n.input]
        casts.append(helper.make_node("Cast", [inner], [o.name], to=TensorProto.FLOAT, name="cast_" + o.name))
    g.node.extend(casts)
    return out


def test_a_cast_model_by_hand_looks_through_its_casts():
    a = mlp()
    b = cast_by_hand(a)
    m = match(index(a), index(b))
    assert m.tensors == {t: t for t in _tensor_names(a)}  # names kept: y is the float32 tensor after the Cast
    assert m.unmatched == ()
    assert m.nodes["tanh"] == "tanh" and m.spans == ()


def test_a_renamed_cast_model_is_matched_through_its_casts():
    a = mlp()
    b, rename = renamed_reordered(cast_by_hand(a), seed=3)
    m = match(index(a), index(b))
    assert m.tensors == {t: rename[t] for t in _tensor_names(a)}
    assert m.unmatched == ()


def test_onnxconverter_common_float16_model():
    f16 = pytest.importorskip("onnxconverter_common.float16")
    a = mlp()
    b = f16.convert_float_to_float16(a, keep_io_types=True)
    m = match(index(a), index(b))
    assert set(m.tensors) == set(_tensor_names(a))
    for t in ("x", "z", "y", "y2"):
        assert m.tensors[t] == t
    assert {u.side for u in m.unmatched} <= {"b"} and not m.spans


def test_onnxconverter_common_blocked_nodes_renamed():
    """Ops kept in float32 (node_block_list) get Casts around them; renamed, each A tensor still maps to
    a B tensor holding its value: the same tensor, or one a Cast of B carries it to."""
    f16 = pytest.importorskip("onnxconverter_common.float16")
    from engine.modeldiff.match_graph import source

    a = mlp()
    b = f16.convert_float_to_float16(a, keep_io_types=True, node_block_list=["relu1", "mul3"])
    plain = match(index(a), index(b))
    assert plain.tensors == {t: t for t in _tensor_names(a)} and plain.unmatched == ()
    renamed, rename = renamed_reordered(b, seed=4)
    gb = index(renamed)
    m = match(index(a), gb)
    assert set(m.tensors) == set(_tensor_names(a)) and m.unmatched == ()
    for t in _tensor_names(a):
        assert source(gb, m.tensors[t]) == source(gb, rename[t])


# --- QDQ and MatMulNBits ---------------------------------------------------------------------------

def test_a_qdq_pair_before_an_op_is_looked_through():
    a = mlp()
    b = onnx.ModelProto()
    b.CopyFrom(a)
    g = b.graph
    g.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "sc"),
                          numpy_helper.from_array(np.array(0, np.int8), "zp")])
    q = [helper.make_node("QuantizeLinear", ["r1", "sc", "zp"], ["r1_q"], name="q"),
         helper.make_node("DequantizeLinear", ["r1_q", "sc", "zp"], ["r1_dq"], name="dq")]
    for n in g.node:
        if n.name == "mm2":
            n.input[0] = "r1_dq"
    g.node.extend(q)
    b = onnx.compose.add_prefix(b, "q/")
    m = match(index(a), index(b))
    assert m.tensors == {t: "q/" + t for t in _tensor_names(a)}
    assert m.nodes["mm2"] == "q/mm2" and m.unmatched == ()


def test_matmul_nbits_stands_for_a_matmul_in_a_one_node_span(tmp_path):
    quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    a = _model(nodes, [_w("w", 64, 32)], [_vi("x", 2, 64)], [_vi("y", 2, 32)], opset=21)
    q = quant.MatMulNBitsQuantizer(onnx.ModelProto.FromString(a.SerializeToString()), block_size=32)
    q.process()
    b = q.model.model
    assert "MatMulNBits" in [n.op_type for n in b.graph.node]
    m = match(index(a), index(b))
    [span] = m.spans
    assert span.a_nodes == ("mm",) and [index(b).nodes[0].op_type] == ["MatMulNBits"]
    assert span.inputs[0] == "x" and span.outputs == ("h",)
    assert m.tensors["h"] in {o for n in b.graph.node for o in n.output if n.op_type == "MatMulNBits"}
    assert m.nodes == {"relu": "relu"}


@pytest.mark.parametrize("constants", ["init", "node"])
def test_a_renamed_reordered_vit_block_is_fully_matched(constants):
    """An exporter-like block (attention, GELU; constants as initializers or Constant nodes, many of the
    same shape): renamed and reordered, every tensor finds its twin."""
    from tests.fusion_models import vit_block

    a = vit_block(constants=constants)
    a = a[0] if isinstance(a, tuple) else a
    b, rename = renamed_reordered(a, seed=11)
    m = match(index(a), index(b))
    assert m.tensors == {t: rename[t] for t in _tensor_names(a)}
    assert m.unmatched == ()


def test_onnxruntime_qdq_quantizer_output(tmp_path):
    """quantize_static in QDQ format: QuantizeLinear→DequantizeLinear pairs before every op, weights as int8
    initializers behind a DequantizeLinear. Every op is matched to its quantized twin, and each float
    weight to the DequantizeLinear output standing for it."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    a = mlp()
    onnx.save(a, str(tmp_path / "a.onnx"))
    rng = np.random.default_rng(1)
    batches = iter([{"x": rng.standard_normal((2, 4), np.float32), "z": rng.standard_normal((2, 8), np.float32)}
                    for _ in range(4)])

    class Reader(quantization.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    quantization.quantize_static(str(tmp_path / "a.onnx"), str(tmp_path / "q.onnx"), Reader(),
                                 quant_format=quantization.QuantFormat.QDQ)
    b = onnx.load(str(tmp_path / "q.onnx"))
    gb = index(b)
    m = match(index(a), gb)
    for name in ("mm1", "mm2", "mm3", "add1", "mul3", "sum", "gate", "tanh"):
        assert m.nodes[name] == name
    for w in ("w1", "w2", "w3"):
        dq = gb.nodes[gb.producer[m.tensors[w]]]
        assert dq.op_type == "DequantizeLinear" and gb.initializers[dq.input[0]].data_type == TensorProto.INT8
    assert {t for t in ("x", "z", "y", "y2", "s")} <= {t for t, u in m.tensors.items() if t == u}
    assert all(u.side == "a" for u in m.unmatched)  # B's scales and zero points are not listed


def test_matching_does_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, engine.modeldiff.matching; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=root).returncode == 0
