"""Oracles the contrib sweep uses where onnxruntime has no CPU kernel: the op's definition written
with ai.onnx ops (and contrib ops onnxruntime does run), executed by onnxruntime; and the float
product whose gradient a straight-through input must get."""
from __future__ import annotations

import numpy as np
from onnx import helper

MS = "com.microsoft"


def _graph_model(case, dtype, nodes, extra_inits=()):
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in case.feeds(dtype).items()]
    out = helper.make_empty_tensor_value_info(case.outputs[0])
    graph = helper.make_graph(nodes, "reference", inputs, [out], initializer=list(extra_inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def bias_add_reference(case, dtype):
    """BiasAdd(X, bias, skip) = X + bias + skip."""
    return _graph_model(case, dtype, [helper.make_node("Add", ["X", "bias"], ["t"]),
                                      helper.make_node("Add", ["t", "skip"], [case.outputs[0]])])


def bias_split_gelu_reference(case, dtype):
    """BiasSplitGelu(X, bias) = left · Gelu(right), (left, right) the halves of X + bias."""
    return _graph_model(case, dtype, [
        helper.make_node("Add", ["X", "bias"], ["t"]),
        helper.make_node("Split", ["t"], ["left", "right"], axis=-1, num_outputs=2),
        helper.make_node("Gelu", ["right"], ["g"]),
        helper.make_node("Mul", ["left", "g"], [case.outputs[0]]),
    ])


def gemm_fast_gelu_reference(case, dtype):
    """GemmFastGelu(X, W, bias) = FastGelu(MatMul(X, W), bias), onnxruntime's own FastGelu kernel."""
    names = dict(case.inputs)
    fast = ["m", "bias"] if names.get("bias") is not None else ["m"]
    return _graph_model(case, dtype, [helper.make_node("MatMul", ["X", "W"], ["m"]),
                                      helper.make_node("FastGelu", fast, [case.outputs[0]], domain=MS)])


def straight_through_gradient(case, name: str, dy: np.ndarray) -> np.ndarray:
    """DynamicQuantizeMatMul's dA as the float product A · dequant(B) has it: dy · dequant(B)ᵀ (float64)."""
    if case.op != "DynamicQuantizeMatMul" or name != "A":
        raise ValueError(f"no straight-through oracle for {case.op} input {name}")
    values = dict(case.inputs)
    b = values["B"].astype(np.float64)
    zero = values.get("b_zero_point")
    if zero is not None:
        b = b - zero.astype(np.float64)
    weight = b * values["b_scale"].astype(np.float64)
    return np.matmul(dy, np.swapaxes(weight, -1, -2)).reshape(values["A"].shape)



def mha_unpacked_reference(case, dtype):
    """MultiHeadAttention with packed QKV (B, S, N, 3, H) or packed KV (B, L, N, 2, H), which onnxruntime's
    CPU kernel refuses: the same node on the unpacked (B, S, N·H) tensors, which it runs."""
    values = dict(case.inputs)
    packed, parts = ("query", 3) if values["query"].ndim == 5 else ("key", 2)
    nodes = [helper.make_node("Constant", [], ["flat"], value=helper.make_tensor("flat", 7, [3], [0, 0, -1]))]
    unpacked = []
    for i in range(parts):
        nodes.append(helper.make_node("Constant", [], [f"i{i}"], value=helper.make_tensor(f"i{i}", 7, [], [i])))
        nodes.append(helper.make_node("Gather", [packed, f"i{i}"], [f"g{i}"], axis=3))
        nodes.append(helper.make_node("Reshape", [f"g{i}", "flat"], [f"u{i}"]))
        unpacked.append(f"u{i}")
    names = [n if v is not None else "" for n, v in case.inputs]
    names[:3] = unpacked if parts == 3 else ["query"] + unpacked
    nodes.append(helper.make_node(case.op, names, list(case.outputs), domain=MS, **dict(case.attrs)))
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in case.feeds(dtype).items()]
    graph = helper.make_graph(nodes, "reference", inputs, [helper.make_empty_tensor_value_info(n) for n in case.outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def gqa_qk_norm_reference(case, dtype):
    """GroupQueryAttention with q_norm_weight / k_norm_weight, which onnxruntime's CPU kernel refuses: the
    per-head RMS norm written as SimplifiedLayerNormalization on (B, S, N, H) views, then the plain node."""
    values = dict(case.inputs)
    attrs = dict(case.attrs)
    head = values["q_norm_weight"].shape[0]
    eps = {"q": attrs.pop("q_norm_epsilon", attrs.get("qk_norm_epsilon", 1e-6)),
           "k": attrs.pop("k_norm_epsilon", attrs.get("qk_norm_epsilon", 1e-6))}
    attrs.pop("qk_norm_epsilon", None)
    nodes = [helper.make_node("Constant", [], ["heads"], value=helper.make_tensor("heads", 7, [4], [0, 0, -1, head])),
             helper.make_node("Constant", [], ["flat"], value=helper.make_tensor("flat", 7, [3], [0, 0, -1]))]
    for t, weight in (("query", "q_norm_weight"), ("key", "k_norm_weight")):
        nodes += [helper.make_node("Reshape", [t, "heads"], [f"{t}_h"]),
                  helper.make_node("SimplifiedLayerNormalization", [f"{t}_h", weight], [f"{t}_n"], axis=-1,
                                   epsilon=float(eps[t[0]])),
                  helper.make_node("Reshape", [f"{t}_n", "flat"], [f"{t}_normed"])]
    names = [n if v is not None else "" for n, v in case.inputs]
    names[0], names[1] = "query_normed", "key_normed"
    names = [("" if n in ("q_norm_weight", "k_norm_weight") else n) for n in names]
    while names and not names[-1]:
        names.pop()
    nodes.append(helper.make_node(case.op, names, list(case.outputs), domain=MS, **attrs))
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in case.feeds(dtype).items()]
    graph = helper.make_graph(nodes, "reference", inputs, [helper.make_empty_tensor_value_info(n) for n in case.outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)],
                             ir_version=10)
