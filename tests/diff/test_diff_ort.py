"""`diff MODEL --against onnxruntime` where onnxruntime cannot replay a node as a model of its own (a
node reading a sequence), where the node has subgraphs (an If reading the outer graph, as merged
decoders are), and where onnxruntime cannot run the file at all."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import engine
from engine.errors import DiffError

from .test_matching import _model, _vi, _w

pytest.importorskip("onnxruntime")


def test_a_node_onnxruntime_will_not_run_alone_is_noted_and_has_no_local_error():
    """SequenceAt reads a sequence; replayed alone its input arrives as a tensor, which onnxruntime
    refuses: the node gets no row, the note names it, and the nodes around it are still compared."""
    n = helper.make_node
    m = _model([n("Relu", ["x"], ["r"], name="relu"), n("SequenceConstruct", ["r", "x"], ["seq"], name="pack"),
                n("SequenceAt", ["seq", "zero"], ["first"], name="pick"), n("Tanh", ["first"], ["y"], name="tanh")],
               [helper.make_tensor("zero", TensorProto.INT64, [], [0])], [_vi("x", 3, 4)], [_vi("y", 3, 4)])
    r = engine.diff(m, against="onnxruntime", feeds={"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)})
    assert not r.diverges
    assert {n.node for n in r.nodes} == {"relu", "tanh"}  # compared where onnxruntime ran the node alone
    assert [t for t in r.notes if "would not run 1 node(s) alone" in t and "'pick' (SequenceAt)" in t]


def test_an_if_node_is_replayed_with_what_its_branches_read_from_outside():
    """The If's branches read W and h from the outer graph: the one-node model gets them (h as an input,
    W as an initializer), so the If has a local error of its own; a wrong branch would show there."""
    n = helper.make_node
    then = helper.make_graph([n("MatMul", ["h", "w"], ["out_then"], name="then_mm")], "then", [],
                             [_vi("out_then", 3, 4)])
    other = helper.make_graph([n("Neg", ["h"], ["out_else"], name="else_neg")], "else", [], [_vi("out_else", 3, 4)])
    m = _model([n("Relu", ["x"], ["h"], name="relu"), n("If", ["cond"], ["z"], then_branch=then, else_branch=other,
                                                          name="branch"),
                n("Sigmoid", ["z"], ["y"], name="sig")],
               [_w("w", 4, 4)], [_vi("x", 3, 4), _vi("cond", elem=TensorProto.BOOL)], [_vi("y", 3, 4)])
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    r = engine.diff(m, against="onnxruntime", feeds={"x": x, "cond": np.array(True)})
    rows = {n.node: n for n in r.nodes}
    assert set(rows) == {"relu", "branch", "sig"} and not r.diverges
    assert rows["branch"].local_error < rows["branch"].tolerance
    assert not [t for t in r.notes if "would not run" in t]


def test_a_file_onnxruntime_cannot_run_is_one_line_diff_error():
    """A training Gradient node (the spec's sample): onnxruntime has no kernel for it."""
    with pytest.raises(DiffError, match="onnxruntime cannot run A") as caught:
        engine.diff("sample_models/spec_conv_gemm.onnx", against="onnxruntime")
    assert "\n" not in str(caught.value)
