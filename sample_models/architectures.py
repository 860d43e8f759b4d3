"""Small real architectures, a kink model, and a hand-written backward graph with its buggy twin.

Every data input is a graph input with a default (an initializer of the same name), so each model
runs with no feeds and any input can still be overridden with `--feed NAME=SPEC`.
"""
from __future__ import annotations

import math

import numpy as np
from graphs import f32, i64, make_model, node, normal, rng
from onnx import ModelProto, helper


def mlp() -> ModelProto:
    g = rng(10)
    x = normal(g, (4, 8))
    targets = np.eye(3, dtype=np.float32)[[0, 2, 1, 2]]  # one-hot labels
    nodes = [
        node("Gemm", ["X", "W1", "b1"], ["H1"], name="fc1"),
        node("Relu", ["H1"], ["A1"], name="relu"),
        node("Gemm", ["A1", "W2", "b2"], ["logits"], name="fc2"),
        node("LogSoftmax", ["logits"], ["logp"], name="log_softmax", axis=1),
        node("Mul", ["T", "logp"], ["picked"], name="pick"),
        node("ReduceSum", ["picked"], ["total"], name="sum", keepdims=0),
        node("Mul", ["total", "neg_inv_batch"], ["loss"], name="mean_nll"),
    ]
    return make_model(
        "mlp", "Two-layer perceptron with a cross-entropy loss; T holds one-hot targets.", nodes,
        defaults={"X": x, "T": targets},
        params={"W1": normal(g, (8, 16), 0.5), "b1": normal(g, (16,), 0.1),
                "W2": normal(g, (16, 3), 0.5), "b2": normal(g, (3,), 0.1),
                "neg_inv_batch": f32(-1.0 / 4)},
        outputs=[("loss", ()), ("logits", (4, 3))],
    )


def small_cnn() -> ModelProto:
    g = rng(11)
    # MaxPool comes before Relu: after a Relu a pooling window of zeros is a tie (a kink).
    nodes = [
        node("Conv", ["X", "conv1_W", "conv1_B"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", "bn_scale", "bn_B", "bn_mean", "bn_var"], ["bn1"], name="bn1"),
        node("MaxPool", ["bn1"], ["p1"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Relu", ["p1"], ["a1"], name="relu1"),
        node("Conv", ["a1", "conv2_W", "conv2_B"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Tanh", ["c2"], ["a2"], name="tanh2"),
        node("AveragePool", ["a2"], ["p2"], name="avgpool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Flatten", ["p2"], ["flat"], name="flatten", axis=1),
        node("Gemm", ["flat", "fc_W", "fc_B"], ["logits"], name="fc"),
    ]
    return make_model(
        "small_cnn", "Conv-BatchNorm-MaxPool-Relu, Conv-Tanh-AveragePool, then a Gemm classifier.", nodes,
        defaults={"X": normal(g, (2, 3, 8, 8))},
        params={"conv1_W": normal(g, (4, 3, 3, 3), 0.3), "conv1_B": normal(g, (4,), 0.1),
                "bn_scale": 1 + normal(g, (4,), 0.1), "bn_B": normal(g, (4,), 0.1),
                "bn_mean": normal(g, (4,), 0.1), "bn_var": 1 + np.abs(normal(g, (4,), 0.1)),
                "conv2_W": normal(g, (6, 4, 3, 3), 0.3), "conv2_B": normal(g, (6,), 0.1),
                "fc_W": normal(g, (24, 5), 0.3), "fc_B": normal(g, (5,), 0.1)},
        outputs=[("logits", (2, 5))],
    )


def transformer_block() -> ModelProto:
    """Pre-norm block, d_model 8, 2 heads of 4, sequence 4: attention then a GELU feed-forward."""
    g = rng(12)
    d, heads, seq = 8, 2, 4
    hd = d // heads
    nodes = [
        node("LayerNormalization", ["X", "ln1_scale", "ln1_B"], ["xn"], name="ln1", axis=-1),
        node("MatMul", ["xn", "Wq"], ["q"], name="q_proj"),
        node("MatMul", ["xn", "Wk"], ["k"], name="k_proj"),
        node("MatMul", ["xn", "Wv"], ["v"], name="v_proj"),
        node("Reshape", ["q", "heads_shape"], ["q4"], name="q_split"),
        node("Reshape", ["k", "heads_shape"], ["k4"], name="k_split"),
        node("Reshape", ["v", "heads_shape"], ["v4"], name="v_split"),
        node("Transpose", ["q4"], ["qh"], name="q_heads", perm=[0, 2, 1, 3]),
        node("Transpose", ["k4"], ["kt"], name="k_heads_t", perm=[0, 2, 3, 1]),
        node("Transpose", ["v4"], ["vh"], name="v_heads", perm=[0, 2, 1, 3]),
        node("MatMul", ["qh", "kt"], ["scores"], name="scores"),
        # A Constant node, not an initializer: constants never need to be listed in zs.
        helper.make_node("Constant", [], ["scale"], name="scale",
                         value=helper.make_tensor("scale", 1, [], [1 / math.sqrt(hd)])),
        node("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
        node("Softmax", ["scaled"], ["attn"], name="softmax", axis=-1),
        node("MatMul", ["attn", "vh"], ["ctx"], name="context"),
        node("Transpose", ["ctx"], ["ctx_t"], name="merge_heads", perm=[0, 2, 1, 3]),
        node("Reshape", ["ctx_t", "model_shape"], ["ctx_m"], name="merge"),
        node("MatMul", ["ctx_m", "Wo"], ["attn_out"], name="o_proj"),
        node("Add", ["X", "attn_out"], ["r1"], name="residual1"),
        node("LayerNormalization", ["r1", "ln2_scale", "ln2_B"], ["rn"], name="ln2", axis=-1),
        node("MatMul", ["rn", "W1"], ["f1"], name="ff1"),
        node("Add", ["f1", "b1"], ["f1b"], name="ff1_bias"),
        # GELU written with Erf (the Gelu op needs opset 20): x * 0.5 * (1 + erf(x / sqrt 2))
        node("Mul", ["f1b", "inv_sqrt2"], ["gx"], name="gelu_scale"),
        node("Erf", ["gx"], ["ge"], name="gelu_erf"),
        node("Add", ["ge", "one"], ["ge1"], name="gelu_add1"),
        node("Mul", ["f1b", "ge1"], ["gm"], name="gelu_mul"),
        node("Mul", ["gm", "half"], ["gelu"], name="gelu_half"),
        node("MatMul", ["gelu", "W2"], ["f2"], name="ff2"),
        node("Add", ["f2", "b2"], ["f2b"], name="ff2_bias"),
        node("Add", ["r1", "f2b"], ["Y"], name="residual2"),
        node("ReduceSumSquare", ["Y"], ["loss"], name="loss", keepdims=0),
    ]
    return make_model(
        "transformer_block", "One pre-norm transformer block (2-head self-attention, GELU MLP) and loss = sum(Y^2).",
        nodes,
        defaults={"X": normal(g, (1, seq, d))},
        params={"ln1_scale": 1 + normal(g, (d,), 0.1), "ln1_B": normal(g, (d,), 0.1),
                "Wq": normal(g, (d, d), 0.35), "Wk": normal(g, (d, d), 0.35),
                "Wv": normal(g, (d, d), 0.35), "Wo": normal(g, (d, d), 0.35),
                "heads_shape": i64([1, seq, heads, hd]), "model_shape": i64([1, seq, d]),
                "ln2_scale": 1 + normal(g, (d,), 0.1), "ln2_B": normal(g, (d,), 0.1),
                "W1": normal(g, (d, 2 * d), 0.35), "b1": normal(g, (2 * d,), 0.1),
                "W2": normal(g, (2 * d, d), 0.25), "b2": normal(g, (d,), 0.1),
                "inv_sqrt2": f32(1 / math.sqrt(2)), "one": f32(1.0), "half": f32(0.5)},
        outputs=[("loss", ()), ("Y", (1, seq, d))],
    )


def lstm_step() -> ModelProto:
    """One LSTM time step (batch 2, input 3, hidden 4): state (h, c) in, state out."""
    g = rng(13)
    hidden, batch, size = 4, 2, 3
    nodes = [
        node("LSTM", ["X", "W", "R", "B", "", "initial_h", "initial_c"], ["Y_seq", "Y_h", "Y_c"], name="lstm",
             hidden_size=hidden),
        node("Add", ["Y_h", "Y_c"], ["state_sum"], name="combine"),
        node("ReduceSumSquare", ["state_sum"], ["loss"], name="loss", keepdims=0),
    ]
    return make_model(
        "lstm_step", "A single LSTM step; loss = sum((h + c)^2) of the new state.", nodes,
        defaults={"X": normal(g, (1, batch, size)), "initial_h": normal(g, (1, batch, hidden), 0.5),
                  "initial_c": normal(g, (1, batch, hidden), 0.5)},
        params={"W": normal(g, (1, 4 * hidden, size), 0.4), "R": normal(g, (1, 4 * hidden, hidden), 0.4),
                "B": normal(g, (1, 8 * hidden), 0.1)},
        outputs=[("loss", ()), ("Y_h", (1, batch, hidden)), ("Y_c", (1, batch, hidden))],
    )


def residual_fanout() -> ModelProto:
    """X feeds a MatMul and the residual Add; W (tied) feeds two MatMuls: both gradients are sums."""
    g = rng(14)
    nodes = [
        node("MatMul", ["X", "W"], ["H"], name="matmul1"),
        node("Tanh", ["H"], ["A"], name="tanh"),
        node("MatMul", ["A", "W"], ["U"], name="matmul2_tied"),
        node("Add", ["U", "X"], ["R"], name="residual"),
        node("ReduceSumSquare", ["R"], ["loss"], name="loss", keepdims=0),
    ]
    return make_model(
        "residual_fanout", "loss = sum((tanh(X W) W + X)^2): X and W each have two consumers.", nodes,
        defaults={"X": normal(g, (4, 8))},
        params={"W": normal(g, (8, 8), 0.35)},
        outputs=[("loss", ()), ("R", (4, 8))],
    )


def kinks() -> ModelProto:
    """Relu(X), Max(X, Y) and Abs(X) with X at 0 and X == Y: derivatives there do not exist."""
    x = f32([0.0, 0.0, 0.0, 1.5, -2.0, 0.5])
    y = f32([0.0, 1.0, -1.0, 1.5, 3.0, 0.5])  # ties with X at 0, 3 and 5
    nodes = [
        node("Relu", ["X"], ["relu"], name="relu"),
        node("Max", ["X", "Y"], ["max"], name="max"),
        node("Abs", ["X"], ["abs"], name="abs"),
        node("Sum", ["relu", "max", "abs"], ["total"], name="total"),
        node("ReduceSum", ["total"], ["loss"], name="loss", keepdims=0),
    ]
    return make_model(
        "kinks", "loss = sum(relu(X) + max(X, Y) + abs(X)) at X = 0 and X == Y: one-sided derivatives differ.",
        nodes, defaults={"X": x, "Y": y}, outputs=[("loss", ())],
    )


def _handwritten(bug: bool) -> ModelProto:
    """y = sum(tanh(W X)); dW = (1 - T^2) X^T and dX = W^T (1 - T^2), written with ordinary ops."""
    g = rng(15)
    dx_weight = "W" if bug else "Wt"  # the bug: W where W^T belongs (W is square, so shapes still fit)
    nodes = [
        node("MatMul", ["W", "X"], ["Z"], name="forward_matmul"),
        node("Tanh", ["Z"], ["T"], name="forward_tanh"),
        node("ReduceSum", ["T"], ["y"], name="forward_sum", keepdims=0),
        node("Mul", ["T", "T"], ["T2"], name="backward_square"),
        node("Sub", ["one", "T2"], ["dZ"], name="backward_tanh"),
        node("Transpose", ["X"], ["Xt"], name="backward_x_t", perm=[1, 0]),
        node("MatMul", ["dZ", "Xt"], ["dW"], name="backward_dW"),
    ]
    if not bug:
        nodes.append(node("Transpose", ["W"], ["Wt"], name="backward_w_t", perm=[1, 0]))
    nodes.append(node("MatMul", [dx_weight, "dZ"], ["dX"], name="backward_dX"))
    name = "handwritten_backward_bug" if bug else "handwritten_backward"
    doc = ("y = sum(tanh(W X)) with its gradients dW and dX computed by ordinary ops"
           + (" -- with a deliberate bug: dX uses W instead of W^T." if bug else "."))
    return make_model(
        name, doc, nodes,
        defaults={"X": normal(g, (4, 3))},
        params={"W": normal(g, (4, 4), 0.5), "one": f32(1.0)},
        outputs=[("y", ()), ("dW", (4, 4)), ("dX", (4, 3))],
    )


def handwritten_backward() -> ModelProto:
    return _handwritten(bug=False)


def handwritten_backward_bug() -> ModelProto:
    return _handwritten(bug=True)
