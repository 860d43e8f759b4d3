"""Models for chasing a gradient bug (issue 20): a NaN that the forward hides and the backward does
not, symbolic dims and integer inputs, and embeddings whose ids also reach y through Shape.

Hand-built with onnx.helper (CI runs them); the torch-exported ones need only torch.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn


def _init(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def hidden_nan_attention() -> onnx.ModelProto:
    """Masked attention as the exporters write it: Where(mask, 0, -inf) added to the scores, a
    Softmax (NaN on a row whose keys are all masked) and Where(IsNaN(p), 0, p) hiding the NaN from
    the forward. A constant-exponent Pow on negative values sits on each side of it: the gradient
    it sends to its exponent is NaN, but flows nowhere."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Pow", ["X", "three"], ["cubed"], name="cube_x"),
        helper.make_node("MatMul", ["cubed", "Wq"], ["q"], name="project"),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("MatMul", ["q", "qt"], ["scores"], name="scores"),
        helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL, name="to_bool"),
        helper.make_node("Unsqueeze", ["keep", "axis1"], ["keep3"], name="per_query"),
        helper.make_node("Where", ["keep3", "zero", "minus_inf"], ["bias"], name="mask_bias"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="add_bias"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("IsNaN", ["probs"], ["is_nan"], name="is_nan"),
        helper.make_node("Where", ["is_nan", "zero", "probs"], ["probs_finite"], name="hide_nan"),
        helper.make_node("MatMul", ["X", "Wv"], ["v"], name="values"),
        helper.make_node("MatMul", ["probs_finite", "v"], ["attended"], name="attend"),
        helper.make_node("Pow", ["attended", "three"], ["attended3"], name="cube_out"),
        helper.make_node("ReduceSum", ["attended3"], ["Y"], keepdims=0, name="total"),
    ]
    graph = helper.make_graph(
        nodes, "hidden_nan_attention",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
        [_init("Wq", rng.standard_normal((4, 4)).astype(np.float32)),
         _init("Wv", rng.standard_normal((4, 4)).astype(np.float32)),
         _init("three", np.float32(3.0)), _init("zero", np.float32(0.0)),
         _init("minus_inf", np.float32(-np.inf)), _init("axis1", np.array([1], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def sqrt_at_zero() -> onnx.ModelProto:
    """Y = sum(sqrt(relu(X))): every forward value finite, the derivative infinite where X <= 0."""
    nodes = [helper.make_node("Relu", ["X"], ["r"], name="relu"),
             helper.make_node("Sqrt", ["r"], ["s"], name="sqrt"),
             helper.make_node("ReduceSum", ["s"], ["Y"], keepdims=0, name="total")]
    graph = helper.make_graph(nodes, "sqrt_at_zero", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


VOCAB, WIDTH, POSITIONS = 7, 4, 6


def embedding_tables():
    rng = np.random.default_rng(1)
    return (rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
            rng.standard_normal((POSITIONS, WIDTH)).astype(np.float32),
            rng.standard_normal((WIDTH, 3)).astype(np.float32))


def token_embeddings() -> onnx.ModelProto:
    """A language model's front as exporters write it: x = E[ids], and position ids from
    Shape(ids), so ids reach y around x through integers only.

        y = (tanh(E[ids] + P[arange(seq)]) * mask[..., None]) @ W      ids, mask: int64 [batch, seq]
    """
    e, p, w = embedding_tables()
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["x"], name="embed"),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="shape"),
        helper.make_node("Gather", ["ids_shape", "one"], ["seq_len"], axis=0, name="seq_len"),
        helper.make_node("Range", ["zero_i", "seq_len", "one"], ["positions"], name="positions"),
        helper.make_node("Gather", ["P", "positions"], ["pe"], name="embed_positions"),
        helper.make_node("Add", ["x", "pe"], ["h"], name="add_positions"),
        helper.make_node("Tanh", ["h"], ["a"], name="tanh"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="mask_float"),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"], name="mask_axis"),
        helper.make_node("Mul", ["a", "mask3"], ["kept"], name="apply_mask"),
        helper.make_node("MatMul", ["kept", "W"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "token_embeddings",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 3])],
        [_init("E", e), _init("P", p), _init("W", w), _init("one", np.int64(1)), _init("zero_i", np.int64(0)),
         _init("last", np.array([-1], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def token_embeddings_oracle(ids: np.ndarray, mask: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d<dy, y>/dx at x = E[ids], by torch code written directly (not from the graph)."""
    e, p, w = (torch.from_numpy(a).double() for a in embedding_tables())
    x = e[torch.from_numpy(ids)].clone().requires_grad_()
    seq = ids.shape[1]
    y = (torch.tanh(x + p[:seq]) * torch.from_numpy(mask).double()[..., None]) @ w
    (g,) = torch.autograd.grad(y, x, torch.from_numpy(dy).double())
    return g.numpy()


def float_shortcut(through_shape: bool) -> onnx.ModelProto:
    """x = 2 F and y = x + g(F): g = F itself (a derivative flows around x: refused) or
    g = Cast(Shape(F)) (only a shape: allowed)."""
    nodes = [helper.make_node("Mul", ["F", "two"], ["x"], name="double")]
    if through_shape:
        nodes += [helper.make_node("Shape", ["F"], ["f_shape"], name="shape"),
                  helper.make_node("Cast", ["f_shape"], ["f_size"], to=TensorProto.FLOAT, name="size"),
                  helper.make_node("Add", ["x", "f_size"], ["y"], name="add")]
    else:
        nodes.append(helper.make_node("Add", ["x", "F"], ["y"], name="add"))
    graph = helper.make_graph(nodes, "float_shortcut", [helper.make_tensor_value_info("F", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              [_init("two", np.float32(2.0))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class NewGelu(nn.Module):
    """GPT-2's activation: x³ through torch.pow, exported as a Pow with a constant exponent."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


class MaskedAttention(nn.Module):
    """One pre-activation attention block with a boolean key mask through scaled_dot_product_attention,
    which torch's exporter writes as Where(mask, 0, -inf), Softmax, Where(IsNaN(p), 0, p)."""

    def __init__(self, width: int = 8, heads: int = 2):
        super().__init__()
        self.qkv, self.proj, self.fc = nn.Linear(width, 3 * width), nn.Linear(width, width), nn.Linear(width, width)
        self.heads, self.act = heads, NewGelu()

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool())
        return self.fc(self.act(self.proj(a.transpose(1, 2).reshape(b, t, d))))


def exported_attention() -> bytes:
    torch.manual_seed(0)
    module = MaskedAttention().eval()
    x, mask = torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.int64)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x, mask), buf, input_names=["x", "attention_mask"], output_names=["y"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    return buf.getvalue()
