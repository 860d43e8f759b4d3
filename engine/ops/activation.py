"""Activation functions and Clip."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import register


@register("Relu", since=1)
def relu(x, *, consumed_inputs=None):
    # NOTE: the derivative at exactly 0 is taken as 0, like torch and every framework.
    return torch.relu(x)


@register("LeakyRelu", since=1)
def leaky_relu(x, *, alpha=0.01, consumed_inputs=None):
    # NOTE: at exactly 0 torch takes the derivative as alpha (the left side).
    return F.leaky_relu(x, alpha)


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


@register("Elu", since=1)
def elu(x, *, alpha=1.0, consumed_inputs=None):
    return F.elu(x, alpha)


@register("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return gamma * F.elu(x, alpha)


@register("Selu", since=1, until=5)
def selu_v1(x, *, alpha=1.6732000112533569, gamma=1.0506999492645264, consumed_inputs=None):
    return selu(x, alpha=alpha, gamma=gamma)


@register("Celu", since=12)
def celu(x, *, alpha=1.0):
    return F.celu(x, alpha)


@register("Sigmoid", since=1)
def sigmoid(x, *, consumed_inputs=None):
    return torch.sigmoid(x)


@register("HardSigmoid", since=1)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5, consumed_inputs=None):
    # NOTE: at the kinks (output exactly 0 or 1) torch's clamp passes the gradient through.
    return torch.clamp(alpha * x + beta, 0.0, 1.0)


@register("HardSwish", since=14)
def hard_swish(x):
    return F.hardswish(x)


@register("Tanh", since=1)
def tanh(x, *, consumed_inputs=None):
    return torch.tanh(x)


@register("Softplus", since=1)
def softplus(x):
    return F.softplus(x)


@register("Softsign", since=1)
def softsign(x):
    return x / (1 + torch.abs(x))


@register("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    # NOTE: discontinuous at x == alpha; the derivative there is taken as 0 (the left side).
    return torch.where(x > alpha, x, torch.zeros_like(x))


@register("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    out = torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))
    return out.to(x.dtype)


@register("Gelu", since=20)
def gelu(x, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(f"Gelu approximate={approximate!r} is not supported; use 'none' or 'tanh'")
    return F.gelu(x, approximate=approximate)


@register("Mish", since=18)
def mish(x):
    return F.mish(x)


@register("Swish", since=24)
def swish(x, *, alpha=1.0):
    return x * torch.sigmoid(alpha * x)


@register("SwiGLU", since=28)
def swiglu(a, b, *, alpha=1.0):
    if a.shape != b.shape:
        raise OnnxGradError(f"SwiGLU needs equal shapes, got {list(a.shape)} and {list(b.shape)}")
    return a * torch.sigmoid(alpha * a) * b


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
