"""Activation functions and Clip."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register


@describe("Relu", needs="out0", rule="dX = dY · (X > 0)          # at X == 0 the subgradient 0 is used")
@register("Relu", since=1)
def relu(x, *, consumed_inputs=None):
    # NOTE: the derivative at exactly 0 is taken as 0, like torch and every framework.
    return torch.relu(x)


@describe("LeakyRelu", needs="in0", rule="dX = dY · (X > 0 ? 1 : {alpha})")
@register("LeakyRelu", since=1)
def leaky_relu(x, *, alpha=0.01, consumed_inputs=None):
    # NOTE: at exactly 0 torch takes the derivative as alpha (the left side).
    return F.leaky_relu(x, alpha)


@describe("PRelu", needs="in0,in1", rule=("dX = dY · (X > 0 ? 1 : slope)", "dslope = unbroadcast(dY · X · (X ≤ 0))"))
@register("PRelu", since=7)
def prelu(x, slope):
    # NOTE: at exactly 0 the derivative is the slope (left side); slope gets x there, i.e. 0.
    return torch.where(x > 0, x, x * slope)


@register("PRelu", since=1, until=6)
def prelu_v1(x, slope, *, consumed_inputs=None):
    # Before opset 7 a 1-D slope of length C applies per channel (axis 1), not numpy-style.
    if slope.dim() == 1 and x.dim() > 2 and slope.shape[0] == x.shape[1] and slope.shape[0] != 1:
        slope = slope.reshape((-1,) + (1,) * (x.dim() - 2))
    return prelu(x, slope)


@describe("Elu", needs="in0,out0", rule="dX = dY · (X > 0 ? 1 : Y + {alpha})")
@register("Elu", since=1)
def elu(x, *, alpha=1.0, consumed_inputs=None):
    return F.elu(x, alpha)


@describe("Selu", needs="in0", rule="dX = dY · {gamma} · (X > 0 ? 1 : {alpha}·exp(X))")
@register("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return gamma * F.elu(x, alpha)


@register("Selu", since=1, until=5)
def selu_v1(x, *, alpha=1.6732000112533569, gamma=1.0506999492645264, consumed_inputs=None):
    return selu(x, alpha=alpha, gamma=gamma)


@describe("Celu", needs="in0", rule="dX = dY · (X > 0 ? 1 : exp(X/{alpha}))")
@register("Celu", since=12)
def celu(x, *, alpha=1.0):
    return F.celu(x, alpha)


@describe("Sigmoid", needs="out0", rule="dX = dY · Y · (1 − Y)")
@register("Sigmoid", since=1)
def sigmoid(x, *, consumed_inputs=None):
    return torch.sigmoid(x)


@describe("HardSigmoid", needs="in0", rule="dX = dY · {alpha} · (0 < {alpha}·X + {beta} < 1)")
@register("HardSigmoid", since=1)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5, consumed_inputs=None):
    # NOTE: at the kinks (output exactly 0 or 1) torch's clamp passes the gradient through.
    return torch.clamp(alpha * x + beta, 0.0, 1.0)


@describe("HardSwish", needs="in0", rule="dX = dY · (X < −3 ? 0 : X > 3 ? 1 : X/3 + ½)")
@register("HardSwish", since=14)
def hard_swish(x):
    return F.hardswish(x)


@describe("Tanh", needs="out0", rule="dX = dY · (1 − Y²)")
@register("Tanh", since=1)
def tanh(x, *, consumed_inputs=None):
    return torch.tanh(x)


@describe("Softplus", needs="in0", rule="dX = dY · sigmoid(X)")
@register("Softplus", since=1)
def softplus(x):
    return F.softplus(x)


@describe("Softsign", needs="in0", rule="dX = dY / (1 + |X|)²")
@register("Softsign", since=1)
def softsign(x):
    return x / (1 + torch.abs(x))


@describe("ThresholdedRelu", needs="in0", rule="dX = dY · (X > {alpha})")
@register("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    # NOTE: discontinuous at x == alpha; the derivative there is taken as 0 (the left side).
    return torch.where(x > alpha, x, torch.zeros_like(x))


@describe("Shrink", needs="in0", rule="dX = dY · (|X| > {lambd})     # 0 inside the band")
@register("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    out = torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))
    return out.to(x.dtype)


@describe("Gelu", needs="in0", rule="dX = dY · (Φ(X) + X · φ(X))   # approximate={approximate}: tanh differentiates its own form")
@register("Gelu", since=20)
def gelu(x, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(f"Gelu approximate={approximate!r} is not supported; use 'none' or 'tanh'")
    return F.gelu(x, approximate=approximate)


@describe("Mish", needs="in0", rule="dX = dY · (tanh(S) + X · sigmoid(X) · (1 − tanh(S)²))   # S = softplus(X)")
@register("Mish", since=18)
def mish(x):
    return F.mish(x)


@describe("Swish", needs="in0", rule="dX = dY · (s + {alpha}·X · s · (1 − s))   # s = sigmoid({alpha}·X)")
@register("Swish", since=24)
def swish(x, *, alpha=1.0):
    return x * torch.sigmoid(alpha * x)


@describe("SwiGLU", needs="in",
          rule=("dA = dY · B · (s + {alpha}·A · s · (1 − s))   # s = sigmoid({alpha}·A)",
                "dB = dY · A · s"))
@register("SwiGLU", since=28)
def swiglu(a, b, *, alpha=1.0):
    if a.shape != b.shape:
        raise OnnxGradError(f"SwiGLU needs equal shapes, got {list(a.shape)} and {list(b.shape)}")
    return a * torch.sigmoid(alpha * a) * b


@describe("Clip", needs="in",
          rule=("dX = dY · (min ≤ X ≤ max)   # at a bound the subgradient 1 is used",
                "dmin = Σ dY where X < min",
                "dmax = Σ dY where X > max"))
@register("Clip", since=11)
def clip(x, min=None, max=None):  # noqa: A002  (ONNX input names)
    # NOTE: at a bound torch's clamp passes the gradient to x (not to the bound); when
    # min > max every element becomes max, as in numpy.
    if min is None and max is None:
        return x
    return torch.clamp(x, min=min, max=max)


@register("Clip", since=6, until=10)
def clip_v6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002
    return torch.clamp(x, min=min, max=max)


@register("Clip", since=1, until=5)
def clip_v1(x, *, min=None, max=None, consumed_inputs=None):  # noqa: A002
    return x if min is None and max is None else torch.clamp(x, min=min, max=max)
