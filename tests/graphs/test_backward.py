"""The backward graph's structure: accumulation at fan-out, the cut at intermediate xs, the seed and dx."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.graphs import build_backward_graph, gradient_with_stats
from tests.graphs.test_diagrams import grad_wrt_h

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return engine.load(m)


def fan_out():
    """P = A*B is read by Tanh, Sigmoid and the final Mul; D feeds a branch y does not see."""
    return _model([
        helper.make_node("Mul", ["A", "B"], ["P"], name="p"),
        helper.make_node("Tanh", ["P"], ["T"], name="t"),
        helper.make_node("Sigmoid", ["P"], ["S"], name="s"),
        helper.make_node("Add", ["T", "S"], ["U"], name="u"),
        helper.make_node("Mul", ["U", "P"], ["Y"], name="y"),
        helper.make_node("Neg", ["D"], ["ND"], name="nd"),
    ], [("A", [3, 4]), ("B", [4]), ("D", [2])], [("Y", [3, 4]), ("ND", [2])])


def test_fan_out_has_an_accumulation_node_fed_by_every_consumer():
    model = fan_out()
    bg = build_backward_graph(model, model.selection("Y", ["A", "B"]))
    (acc,) = bg.accumulations
    assert acc.tensor == "P" and acc.id == "acc:P"
    names = model.graph.node_names
    sources = sorted(names[bg.node(e.source).node_index] for e in bg.edges_into("acc:P"))
    assert sources == ["s", "t", "y"]
    assert all(e.partial for e in bg.edges_into("acc:P"))
    (out,) = bg.edges_from("acc:P")
    assert not out.partial and bg.node(out.target).node_index == names.index("p")
    assert [n.kind for n in bg.nodes][0] == "seed" and [n.kind for n in bg.nodes][-2:] == ["dx", "dx"]
    assert names.index("nd") not in bg.active_nodes


def test_partial_gradients_at_the_fan_out_match_the_chain_rule_by_hand():
    model = fan_out()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    result, stats = gradient_with_stats(model, "Y", ["A", "B"], feeds={"A": a, "B": b}, dtype="float64",
                                        keep_gradients=True)
    p = a * b
    t, s = np.tanh(p), 1 / (1 + np.exp(-p))
    u = t + s
    expected = {"t": (1 - t**2), "s": s * (1 - s), "y": u}  # dy/dU = P, so dT = dS = P
    names = model.graph.node_names
    for e in stats.backward.edges_into("acc:P"):
        who = names[int(e.source[1:])]
        local = expected[who] * (p if who in "ts" else 1.0)
        np.testing.assert_allclose(stats.gradients[e.key], local, rtol=1e-12)
    np.testing.assert_allclose(result.grads["A"], (u + p * (expected["t"] + expected["s"])) * b, rtol=1e-12)


def test_intermediate_xs_stop_the_backward_graph_at_the_cut():
    model = engine.load(grad_wrt_h())
    bg = build_backward_graph(model, model.selection("Y", ["H", "Z"]))
    conv = [n.op_type for n in model.graph.nodes].index("Conv")
    assert bg.cuts == ("H",)
    assert conv not in bg.active_nodes and bg.backward_node_of(conv) is None
    (into_dh,) = bg.edges_into("dx:H")
    assert bg.node(into_dh.source).op_type == "Flatten"
    assert "X" not in bg.active_tensors and "W" not in bg.active_tensors


def test_y_in_xs_seeds_its_own_dx_and_disconnected_xs_get_no_edges():
    model = fan_out()
    bg = build_backward_graph(model, model.selection("P", ["P", "D"]))
    assert [(e.source, e.target) for e in bg.edges] == [("seed", "dx:P")]
    assert bg.node("dx:D").disconnected and not bg.edges_into("dx:D")


def test_zs_branches_are_off_the_slice():
    model = _model([
        helper.make_node("Mul", ["A", "B"], ["AB"]),
        helper.make_node("Mul", ["C", "D"], ["CD"]),
        helper.make_node("Add", ["AB", "CD"], ["Y"]),
    ], [("A", [2]), ("B", [2]), ("C", [2]), ("D", [2])], [("Y", [2])])
    bg = build_backward_graph(model, model.selection("Y", ["A"], ["B", "C", "D"]))
    assert bg.active_nodes == (0, 2)
    assert "CD" not in bg.active_tensors and not bg.accumulations
    assert [n.sends_to for n in bg.nodes if n.kind == "backward"] == [("AB",), ("A",)]
    assert {n.op_type: n.needs for n in bg.nodes if n.kind == "backward"} == {"Add": (), "Mul": ("A", "B")}


OPS = ["Add", "Mul", "Sub", "Tanh", "Sigmoid", "Neg", "Max"]


@st.composite
def random_dag(draw):
    """A small DAG of elementwise ops over 2-3 inputs, y the last node's output."""
    n_inputs = draw(st.integers(2, 3))
    tensors = [f"I{k}" for k in range(n_inputs)]
    nodes = []
    for k in range(draw(st.integers(1, 7))):
        op = draw(st.sampled_from(OPS))
        arity = 1 if op in ("Tanh", "Sigmoid", "Neg") else 2
        ins = [draw(st.sampled_from(tensors)) for _ in range(arity)]
        nodes.append(helper.make_node(op, ins, [f"T{k}"], name=f"n{k}"))
        tensors.append(f"T{k}")
    inputs = [f"I{k}" for k in range(n_inputs)]
    xs = draw(st.lists(st.sampled_from(inputs), min_size=1, max_size=n_inputs, unique=True))
    return nodes, inputs, xs, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None)
@given(random_dag())
def test_random_dags_route_every_gradient_once_and_stats_match_model_gradient(case):
    nodes, inputs, xs, seed = case
    y = nodes[-1].output[0]
    model = _model(nodes, [(n, [3]) for n in inputs], [(y, [3])])
    zs = [n for n in inputs if n not in xs]
    spec = model.selection(y, xs, zs)
    bg = build_backward_graph(model, spec)
    for t in bg.active_tensors:
        whole = [e for e in bg.edges if e.tensor == t and not e.partial]
        assert len(whole) == 1, t  # one edge carries dy/dt to its producer's VJP or to dx
        users = {i for i in bg.active_nodes if t in model.graph.nodes[i].input}
        partial = [e for e in bg.edges if e.tensor == t and e.partial]
        assert len(partial) == (len(users) if len(users) > 1 else 0)
    feeds = {n: np.random.default_rng(seed + k).standard_normal(3) for k, n in enumerate(inputs)}
    result, stats = gradient_with_stats(model, y, xs, zs, feeds=feeds, dtype="float64", keep_gradients=True)
    reference = model.gradient(y, xs, zs, feeds=feeds, dtype="float64")
    for x in xs:
        # Per-consumer aliases may change autograd's summation order at a fan-out: an ulp, no more.
        np.testing.assert_allclose(result.grads[x], reference.grads[x], rtol=1e-13, atol=1e-15)
        for e in bg.edges_into(f"dx:{x}"):
            np.testing.assert_allclose(stats.edges[e.key].norm, np.linalg.norm(reference.grads[x]), rtol=1e-12)
    for acc in bg.accumulations:
        parts = sum(stats.gradients[e.key] for e in bg.edges_into(acc.id))
        (out,) = bg.edges_from(acc.id)
        np.testing.assert_allclose(parts, stats.gradients[out.key], rtol=1e-12, atol=1e-12)
