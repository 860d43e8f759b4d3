"""Models for chasing a gradient bug (issue 20): a NaN that the forward hides and the backward does
not, symbolic dims and integer inputs, and embeddings whose ids also reach y through Shape.

Hand-built with onnx.helper (CI runs them; the two the docs use live in engine/examples.py); the
torch-exported ones need only torch.
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

from engine.examples import VOCAB, embedding_tables, hidden_nan_attention, token_embeddings  # noqa: F401


def _init(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def sqrt_at_zero() -> onnx.ModelProto:
    """Y = sum(sqrt(relu(X))): every forward value finite, the derivative infinite where X <= 0."""
    nodes = [helper.make_node("Relu", ["X"], ["r"], name="relu"),
             helper.make_node("Sqrt", ["r"], ["s"], name="sqrt"),
             helper.make_node("ReduceSum", ["s"], ["Y"], keepdims=0, name="total")]
    graph = helper.make_graph(nodes, "sqrt_at_zero", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])])
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
