"""Small model pairs for the diff tests: one node changed each (built with onnx.helper, fixed seeds)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.verify_models import init, make, vi

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((8, 8)).astype(np.float32) / 3
W2 = RNG.standard_normal((8, 4)).astype(np.float32) / 3
X = RNG.standard_normal((4, 8)).astype(np.float32)


def chain(*, act="LeakyRelu", alpha=0.1, w2_scale=1.0, gemm_trans_b=False) -> onnx.ModelProto:
    """x -> mm1 (Gemm) -> act -> mm2 (MatMul) -> y (ReduceSum): `act`, its alpha, W2's scale and how W1 is
    stored (transposed for transB=1) vary."""
    w1 = W1.T.copy() if gemm_trans_b else W1
    mm1 = helper.make_node("Gemm", ["x", "W1"], ["h"], "mm1", transB=1 if gemm_trans_b else 0)
    act_node = (helper.make_node(act, ["h"], ["a"], "act", alpha=alpha) if act == "LeakyRelu"
                else helper.make_node(act, ["h"], ["a"], "act"))
    nodes = [mm1, act_node, helper.make_node("MatMul", ["a", "W2"], ["o"], "mm2"),
             helper.make_node("ReduceSum", ["o"], ["y"], "total", keepdims=0)]
    return make(nodes, [vi("x", [4, 8])], [vi("y", [])], [init("W1", w1), init("W2", W2 * np.float32(w2_scale))])


def fake_quant(quantize: bool) -> onnx.ModelProto:
    """h = x * W (then y = ReduceSum(h)); with `quantize`, h is rounded to halves by Round(2h)/2: equal
    values on inputs that are already halves, but Round sends back no gradient (no straight-through)."""
    w = np.array([0.5, 1.0, 1.5, 2.0], np.float32)
    if quantize:
        nodes = [helper.make_node("Mul", ["x", "W"], ["raw"], "scale_raw"),
                 helper.make_node("Mul", ["raw", "two"], ["doubled"], "double"),
                 helper.make_node("Round", ["doubled"], ["rounded"], "round"),
                 helper.make_node("Div", ["rounded", "two"], ["h"], "scale")]
    else:
        nodes = [helper.make_node("Mul", ["x", "W"], ["h"], "scale")]
    nodes.append(helper.make_node("ReduceSum", ["h"], ["y"], "total", keepdims=0))
    return make(nodes, [vi("x", [4])], [vi("y", [])], [init("W", w), init("two", np.array(2.0, np.float32))])


HALVES = np.array([1.0, -0.5, 2.0, 3.5], np.float32)


def overflow() -> onnx.ModelProto:
    """x in [1, 2] -> ×100 -> squared (≤ 40 000, fits float16) -> ×4 (≤ 160 000: float16 overflows here)
    -> ×1e-3 -> y."""
    nodes = [helper.make_node("Mul", ["x", "hundred"], ["s"], "scale"),
             helper.make_node("Mul", ["s", "s"], ["sq"], "square"),
             helper.make_node("Mul", ["sq", "four"], ["big"], "grow"),
             helper.make_node("Mul", ["big", "milli"], ["small"], "shrink"),
             helper.make_node("ReduceSum", ["small"], ["y"], "total", keepdims=0)]
    consts = [init("hundred", np.array(100, np.float32)), init("four", np.array(4, np.float32)),
              init("milli", np.array(1e-3, np.float32))]
    return make(nodes, [vi("x", [6])], [vi("y", [])], consts)


OVERFLOW_X = np.linspace(1, 2, 6).astype(np.float32)


def masked_softmax() -> onnx.ModelProto:
    """x + mask (float32's most negative number where masked, as exporters write it) -> Softmax -> y."""
    mask = np.array([0, 0, np.finfo(np.float32).min, 0], np.float32)
    nodes = [helper.make_node("Add", ["x", "mask"], ["masked"], "apply_mask"),
             helper.make_node("Softmax", ["masked"], ["p"], "softmax", axis=-1),
             helper.make_node("ReduceSumSquare", ["p"], ["y"], "total", keepdims=0)]
    return make(nodes, [vi("x", [4])], [vi("y", [])], [init("mask", mask)])


def cast_pair(scale: float = 1.0) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A: y = Relu(x @ W) in float32; B: the same in float16 between inserted Casts (as a float16
    converter keeping float32 inputs and outputs writes it), W optionally scaled."""
    from onnx import TensorProto

    a = make([helper.make_node("MatMul", ["x", "W"], ["h"], "mm"), helper.make_node("Relu", ["h"], ["y"], "act")],
             [vi("x", [4, 8])], [vi("y", [4, 8])], [init("W", W1)])
    b = make([helper.make_node("Cast", ["x"], ["x16"], "cast_in", to=TensorProto.FLOAT16),
              helper.make_node("MatMul", ["x16", "W"], ["h"], "mm"),
              helper.make_node("Relu", ["h"], ["y16"], "act"),
              helper.make_node("Cast", ["y16"], ["y"], "cast_out", to=TensorProto.FLOAT)],
             [vi("x", [4, 8])], [vi("y", [4, 8])], [init("W", (W1 * np.float32(scale)).astype(np.float16))])
    return a, b
