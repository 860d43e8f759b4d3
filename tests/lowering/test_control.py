"""Control flow lowered: If (branches read the enclosing graph), Loop (a run-time trip count, carried
values, a scan output, a weight read from outside the body) and Scan (a weight read from outside), run by
onnxruntime against the engine, at both values of the condition and two trip counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import engine
from tests.lowering_checks import assert_close, check_valid, ort_run

pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _lowered_matches(model, y, xs, zs, feeds_list):
    lowered = engine.lower(model, y, xs, zs, dy=True)
    check_valid(lowered)
    m = engine.load(model)
    for k, feeds in enumerate(feeds_list):
        dy = np.random.default_rng(k).standard_normal(m.run(feeds)[y].shape).astype(np.float32)
        want = m.gradient(y, xs, zs, feeds=feeds, dy=dy).grads
        assert_close(ort_run(lowered, {**feeds, f"d{y}": dy}), {f"d{y}_d{x}": g for x, g in want.items()})


def test_if_branches_read_the_enclosing_graph():
    """y = If(c) then tanh(X * W) else X + W², X and W read by the branches; gradients w.r.t. both."""
    then_g = helper.make_graph([helper.make_node("Mul", ["X", "W"], ["m"]), helper.make_node("Tanh", ["m"], ["t"])],
                               "then", [], [vi("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["W", "W"], ["w2"]), helper.make_node("Add", ["X", "w2"], ["e"])],
                               "else", [], [vi("e", F, [2, 3])])
    graph = helper.make_graph(
        [helper.make_node("Exp", ["V"], ["W"]), helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "if", [vi("c", TensorProto.BOOL, []), vi("X", F, [2, 3]), vi("V", F, [2, 3])], [vi("y", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(0)
    x, v = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    _lowered_matches(model, "y", ["X", "V"], ["c"], [{"c": np.array(c), "X": x, "V": v} for c in (True, False)])


def test_loop_with_run_time_trip_count_and_outer_weight():
    """s_{k+1} = tanh(s_k * a + w · k), a read from outside the body, w a carried input; a scan output
    stacks every s; y sums the final state and the stack."""
    body = helper.make_graph([
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Cast", ["i"], ["i_f"], to=F),
        helper.make_node("Mul", ["s_in", "a"], ["sa"]),
        helper.make_node("Mul", ["w_in", "i_f"], ["wi"]),
        helper.make_node("Add", ["sa", "wi"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["s_out"]),
        helper.make_node("Identity", ["w_in"], ["w_out"]),
        helper.make_node("Identity", ["s_out"], ["s_scan"]),
    ], "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("s_in", F, [3]),
                vi("w_in", F, [3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("s_out", F, [3]), vi("w_out", F, [3]), vi("s_scan", F, [3])])
    graph = helper.make_graph([
        helper.make_node("Loop", ["M", "", "s0", "w"], ["s", "w_final", "trace"], body=body),
        helper.make_node("ReduceSum", ["trace", "zero"], ["col"], keepdims=0),
        helper.make_node("Mul", ["col", "s"], ["y"]),
    ], "loop", [vi("M", TensorProto.INT64, []), vi("s0", F, [3]), vi("w", F, [3]), vi("a", F, [3])], [vi("y", F, [3])],
        [helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(1)
    values = {k: (rng.standard_normal(3) * 0.5).astype(np.float32) for k in ("s0", "w", "a")}
    _lowered_matches(model, "y", ["s0", "w", "a"], ["M"], [{**values, "M": np.array(n)} for n in (3, 5)])


def test_scan_body_reads_an_outer_weight():
    """A running sum of tanh(x_t * W) over 4 steps, W read from outside the body."""
    body = helper.make_graph([
        helper.make_node("Mul", ["x_t", "W"], ["xw"]), helper.make_node("Tanh", ["xw"], ["t"]),
        helper.make_node("Add", ["acc_in", "t"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["seen"]),
    ], "body", [vi("acc_in", F, [3]), vi("x_t", F, [3])], [vi("acc_out", F, [3]), vi("seen", F, [3])])
    graph = helper.make_graph([
        helper.make_node("Scan", ["init", "X"], ["acc", "trace"], body=body, num_scan_inputs=1),
        helper.make_node("Mul", ["acc", "trace"], ["y"]),
    ], "scan", [vi("init", F, [3]), vi("X", F, [4, 3]), vi("W", F, [3])], [vi("y", F, [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(2)
    feeds = {"init": rng.standard_normal(3).astype(np.float32), "X": rng.standard_normal((4, 3)).astype(np.float32),
             "W": rng.standard_normal(3).astype(np.float32)}
    _lowered_matches(model, "y", ["init", "X", "W"], [], [feeds])
