"""Small torch nn modules for tests/run/test_torch_export.py: each is exported with torch's TorchScript
exporter, and the engine must reproduce torch's own outputs and gradients on the exported graph.

An ExportCase names the module, how to make its inputs, which parameters to differentiate
(state_dict names, which the exporter keeps as initializer names with do_constant_folding=False)
and the opsets to export at. `ops` lists op types the exported graph must contain, so a case
cannot silently stop exercising what it claims to. Constants in modules are chosen exact in
float32 (0.125, 0.75, ...) so that float64 gradients can be held to 1e-9; cases whose exported
graph carries a float32-rounded constant say so and loosen grad_rtol.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ExportCase:
    name: str
    build: Callable[[], nn.Module]
    shapes: tuple  # per input: a float shape, ("int", high | (low, high), shape) or ("lengths", values)
    params: tuple[str, ...] = ()
    opsets: tuple[int, ...] = (13,)
    ops: frozenset[str] = frozenset()
    dynamic: dict | None = None  # input/output name -> {axis: label}
    resized: tuple | None = None  # `shapes` at another size along the dynamic axes (forward re-checked)
    grad_rtol: float = 1e-9
    fwd_rtol: float = 1e-4
    engine_gap: str | None = None  # an op type the exported graph needs and our engine lacks (xfail)
    export_limit: str | None = None  # why torch's exporter refuses this module: the case is skipped


class Fn(nn.Module):
    """A parameter-free module around a function of the inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def case(name, build, *shapes, ops="", **kw) -> ExportCase:
    return ExportCase(name, build, tuple(shapes), ops=frozenset(ops.split()), **kw)


def fn(name, f, *shapes, **kw) -> ExportCase:
    return case(name, lambda: Fn(f), *shapes, **kw)


# --- MLP with every activation ------------------------------------------------------------------
ACTIVATIONS = {
    "relu": (nn.ReLU, "Relu"), "relu6": (nn.ReLU6, "Clip"), "leaky_relu": (lambda: nn.LeakyReLU(0.125), "LeakyRelu"),
    "elu": (lambda: nn.ELU(0.75), "Elu"), "selu": (nn.SELU, "Selu"), "celu": (lambda: nn.CELU(1.25), "Celu"),
    "gelu": (nn.GELU, "Erf"), "gelu_tanh": (lambda: nn.GELU("tanh"), "Tanh"), "gelu_native": (nn.GELU, "Gelu"),
    "gelu_tanh_native": (lambda: nn.GELU("tanh"), "Gelu"), "silu": (nn.SiLU, "Sigmoid"),
    "mish": (nn.Mish, ""), "softplus": (lambda: nn.Softplus(beta=1.5), "Softplus"), "softsign": (nn.Softsign, ""),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 0.75), "Clip"), "hardsigmoid": (nn.Hardsigmoid, "HardSigmoid"),
    "hardswish": (nn.Hardswish, ""), "sigmoid": (nn.Sigmoid, "Sigmoid"), "tanh": (nn.Tanh, "Tanh"),
    "prelu": (lambda: nn.PReLU(6), "PRelu"), "logsigmoid": (nn.LogSigmoid, ""), "glu": (nn.GLU, "Split Sigmoid"),
    "softshrink": (lambda: nn.Softshrink(0.25), "Where"), "hardshrink": (lambda: nn.Hardshrink(0.25), "Where"),
    "tanhshrink": (nn.Tanhshrink, "Tanh"), "softmin": (lambda: nn.Softmin(1), "Softmax"),
}
SPECIAL_OPSETS = {"gelu": (11, 17), "gelu_tanh": (13,), "gelu_native": (20,), "gelu_tanh_native": (20,),
                  "celu": (12, 17), "hardswish": (11, 14, 18),
                  "mish": (11, 18), "softsign": (11, 17), "prelu": (11, 16), "glu": (11, 13, 18),
                  "softmin": (11, 13)}
# The exporter writes these constants (1/sqrt(2), SELU's alpha and scale, 1/6, ...) as float32, so
# the float64 graph differs from torch's float64 module by float32 rounding of a constant.
FLOAT32_CONSTANTS = {"selu", "gelu", "gelu_tanh", "gelu_native", "gelu_tanh_native", "hardsigmoid", "hardswish"}


def _mlp(make_act, width):
    return lambda: nn.Sequential(nn.Linear(4, 6), make_act(), nn.Linear(width, 3))


MLP_CASES = [
    case(f"mlp_{name}", _mlp(make, 3 if name == "glu" else 6), (5, 4), ops=op,
         params=("0.weight", "0.bias", "2.weight") + (("1.weight",) if name == "prelu" else ()),
         opsets=SPECIAL_OPSETS.get(name, (13, 17)), grad_rtol=1e-6 if name in FLOAT32_CONSTANTS else 1e-9)
    for name, (make, op) in ACTIVATIONS.items()
]


# --- convolutions, pooling, normalization, resizing ------------------------------------------------
def _with_stats(module):
    """Eval-mode batch norm with non-trivial running statistics."""
    def build():
        m = module()
        for bn in m.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.normal_(0, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
        return m
    return build


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2, ceil_mode=True)
        h = F.adaptive_avg_pool2d(F.relu(self.conv2(h)), 1).flatten(1)
        return self.fc(F.dropout(h, 0.5, self.training))


CNN_CASES = [
    case("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2), (2, 3, 9), ops="Conv",
         params=("weight", "bias"), opsets=(11, 13)),
    case("conv2d_groups", lambda: nn.Conv2d(4, 6, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
         (2, 4, 7, 8), ops="Conv", params=("weight", "bias"), opsets=(11, 13)),
    case("conv2d_depthwise_same", lambda: nn.Conv2d(3, 3, (3, 2), padding="same", groups=3, bias=False),
         (1, 3, 5, 6), ops="Conv", params=("weight",)),
    case("conv2d_reflect", lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (1, 2, 5, 5),
         ops="Conv Pad", params=("weight", "bias"), opsets=(11, 18)),
    case("conv3d", lambda: nn.Conv3d(2, 4, 2, stride=(1, 2, 1), padding=1), (1, 2, 4, 4, 3), ops="Conv",
         params=("weight", "bias")),
    case("conv_transpose1d", lambda: nn.ConvTranspose1d(3, 2, 3, stride=2, padding=1, output_padding=1),
         (2, 3, 5), ops="ConvTranspose", params=("weight", "bias"), opsets=(11, 13)),
    case("conv_transpose2d_groups", lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1,
                                                               groups=2, dilation=(1, 2)),
         (1, 4, 4, 5), ops="ConvTranspose", params=("weight", "bias"), opsets=(11, 13)),
    fn("maxpool2d_ceil", lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), (2, 2, 6, 7),
       ops="MaxPool", opsets=(11, 13)),
    fn("maxpool2d_dilated", lambda x: F.max_pool2d(x, 2, stride=1, dilation=2), (1, 2, 5, 6), ops="MaxPool"),
    fn("maxpool1d", lambda x: F.max_pool1d(x, 2), (2, 3, 7), ops="MaxPool"),
    fn("avgpool2d_ceil_exclude_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
       (2, 2, 6, 7), ops="AveragePool", opsets=(11, 13, 19)),
    fn("avgpool2d_include_pad", lambda x: F.avg_pool2d(x, (2, 3), 2, (1, 1), count_include_pad=True),
       (1, 2, 5, 6), ops="AveragePool", opsets=(11, 13)),
    fn("avgpool1d", lambda x: F.avg_pool1d(x, 3, 2), (2, 3, 8), ops="AveragePool"),
    fn("avgpool3d", lambda x: F.avg_pool3d(x, 2), (1, 2, 4, 4, 4), ops="AveragePool"),
    fn("adaptive_avgpool2d_1", lambda x: F.adaptive_avg_pool2d(x, 1), (2, 3, 4, 5), ops="GlobalAveragePool"),
    fn("adaptive_maxpool2d_1", lambda x: F.adaptive_max_pool2d(x, 1), (2, 3, 4, 5), ops="MaxPool"),
    case("batchnorm1d_2d", _with_stats(lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))), (5, 3),
         ops="BatchNormalization", params=("0.weight", "1.weight", "1.bias"), opsets=(11, 15)),
    case("batchnorm1d_3d", _with_stats(lambda: nn.BatchNorm1d(3)), (2, 3, 4), ops="BatchNormalization",
         params=("weight", "bias")),
    case("batchnorm2d", _with_stats(lambda: nn.BatchNorm2d(3)), (2, 3, 4, 4), ops="BatchNormalization",
         params=("weight", "bias"), opsets=(9, 11, 15)),
    case("instancenorm2d", lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5), ops="InstanceNormalization",
         params=("weight", "bias")),
    case("groupnorm", lambda: nn.GroupNorm(2, 4), (2, 4, 3, 3), params=("weight", "bias"), opsets=(11, 18)),
    case("layernorm", lambda: nn.LayerNorm((3, 4)), (2, 3, 4), params=("weight", "bias"), opsets=(11, 17)),
    case("dropout_eval", lambda: nn.Sequential(nn.Linear(4, 5), nn.Dropout(0.5), nn.Linear(5, 2)), (3, 4),
         params=("0.weight", "2.weight"), opsets=(9, 13)),
    case("small_cnn", _with_stats(SmallCNN), (2, 3, 8, 8), ops="Conv BatchNormalization MaxPool GlobalAveragePool",
         params=("conv1.weight", "bn.weight", "conv2.bias", "fc.weight"), opsets=(11, 13, 17)),
    fn("upsample_nearest", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (1, 2, 3, 4), ops="Resize",
       opsets=(11, 13, 18)),
    fn("interpolate_nearest_size", lambda x: F.interpolate(x, size=(5, 7), mode="nearest"), (1, 2, 3, 4),
       ops="Resize", opsets=(11, 13)),
    fn("upsample_bilinear", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
       (1, 2, 3, 4), ops="Resize", opsets=(11, 13, 18)),
    fn("upsample_bilinear_align", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
       (1, 2, 3, 4), ops="Resize", opsets=(11, 13, 18)),
    fn("interpolate_bilinear_down", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear"), (1, 2, 5, 5),
       ops="Resize"),
    fn("interpolate_linear_1d", lambda x: F.interpolate(x, size=7, mode="linear", align_corners=True), (2, 2, 4),
       ops="Resize"),
    fn("interpolate_bicubic", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), (1, 1, 4, 4),
       ops="Resize", opsets=(11, 13)),
    fn("interpolate_trilinear", lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), (1, 1, 2, 3, 2),
       ops="Resize"),
    case("pixel_shuffle", lambda: nn.PixelShuffle(2), (1, 8, 2, 3), ops="DepthToSpace", opsets=(11, 13)),
    case("pixel_unshuffle", lambda: nn.PixelUnshuffle(2), (1, 2, 4, 6)),
]


# --- attention -------------------------------------------------------------------------------------
class TinyBlock(nn.Module):
    """A pre-norm transformer block with attention written out, over a dynamic sequence length."""

    def __init__(self, dim=8, heads=2, vocab=5):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d // self.heads)
        pos = torch.arange(t)
        causal = (pos[None, :] > pos[:, None]).expand(b, self.heads, t, t)
        att = torch.where(causal, torch.full_like(scores, -1e4), scores).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        even = (pos % 2 == 0).to(x.dtype)[None, :, None]
        x = torch.cat([x[:, :1] * 2, x[:, 1:] * (1 + even[:, 1:])], dim=1)
        return self.head(x).log_softmax(-1) + x[:, 0].sum(-1)[:, None, None]


class TorchAttention(nn.Module):
    """nn.MultiheadAttention with a causal mask. Its export is not dynamic in the sequence length:
    the exporter bakes (t, batch * heads, head_dim) into a Reshape (onnxruntime fails there too).
    The mask uses triu, which the exporter supports from opset 14."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class EmbedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, ids):
        return torch.tanh(self.lin(self.emb(ids)))


ATTENTION_CASES = [
    case("transformer_block", TinyBlock, (2, 4, 8),
         ops="MatMul Softmax LogSoftmax Split Slice Gather Shape Concat Reshape Transpose Expand Where Cast Equal "
             "Range Einsum",
         params=("ln1.weight", "qkv.weight", "proj.bias", "mlp.0.weight", "head.weight"), opsets=(13, 17),
         dynamic={"x0": {0: "b", 1: "t"}, "y": {0: "b", 1: "t"}}, resized=((3, 6, 8),)),
    case("multihead_attention", TorchAttention, (2, 4, 8), ops="MatMul Softmax Trilu",
         params=("attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight"), opsets=(14, 17)),
    # 14 ids drawn from 10 repeat, so the weight's gradient must accumulate over repeats.
    case("embedding", EmbedMLP, ("int", 10, (2, 7)), ops="Gather", params=("emb.weight", "lin.weight"),
         opsets=(11, 13)),
]


# --- recurrent networks ---------------------------------------------------------------------------
class Recurrent(nn.Module):
    """The whole output and the final states, flattened into one tensor to differentiate."""

    def __init__(self, rnn, with_state):
        super().__init__()
        self.rnn = rnn
        self.with_state = with_state

    def forward(self, x, *state):
        if self.with_state and isinstance(self.rnn, nn.LSTM):
            out, rest = self.rnn(x, (state[0], state[1]))
        else:
            out, rest = self.rnn(x, *state)
        rest = rest if isinstance(rest, tuple) else (rest,)
        return torch.cat([out.flatten()] + [r.flatten() for r in rest])


def _rnn(name, make, layers, bidir, batch_first, with_state, op, opsets=(11, 14)):
    x = (2, 5, 3) if batch_first else (5, 2, 3)
    state = (layers * (2 if bidir else 1), 2, 4)
    shapes = (x,) + ((state,) * (2 if op == "LSTM" else 1) if with_state else ())
    last = layers - 1
    params = ("rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_hh_l0", f"rnn.bias_ih_l{last}")
    params += (f"rnn.weight_hh_l{last}_reverse",) if bidir else ()

    def build():
        return Recurrent(make(3, 4, num_layers=layers, bidirectional=bidir, batch_first=batch_first), with_state)

    return case(name, build, *shapes, ops=op, params=params, opsets=opsets)


RNN_CASES = [
    _rnn("rnn_tanh_2layer_state", nn.RNN, 2, False, True, True, "RNN"),
    _rnn("rnn_relu_bidir", lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k), 1, True, False, False, "RNN"),
    _rnn("lstm_state", nn.LSTM, 1, False, False, True, "LSTM"),
    _rnn("lstm_2layer_bidir_batch_first", nn.LSTM, 2, True, True, False, "LSTM"),
    _rnn("gru_2layer", nn.GRU, 2, False, False, False, "GRU"),
    _rnn("gru_bidir_batch_first_state", nn.GRU, 1, True, True, True, "GRU"),
]

NN_CASES = MLP_CASES + CNN_CASES + ATTENTION_CASES + RNN_CASES
