"""Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli and Multinomial.

A `seed` attribute draws from numpy's legacy RandomState(seed) stream, so seeded graphs give the
same numbers as ONNX's reference implementation on every run and device; without a seed torch's
global generator draws. Samples are constants for differentiation: nothing flows back through
a draw (the *Like ops take only their input's shape and type).
"""
from __future__ import annotations

import numpy as np
import torch

from ..dtypes import onnx_to_torch
from ..errors import OnnxGradError
from ..registry import describe, register


def _dtype(dtype, like=None, float_dtype=None):
    t = like.dtype if dtype is None and like is not None else onnx_to_torch(1 if dtype is None else dtype)
    return float_dtype if float_dtype is not None and t.is_floating_point else t


def _uniform(shape, seed, device):
    """Uniform [0, 1) float64 samples."""
    if seed is None:
        return torch.rand(shape, dtype=torch.float64, device=device)
    return torch.from_numpy(np.random.RandomState(int(seed)).random_sample(tuple(shape))).to(device)


def _normal(shape, seed, device):
    if seed is None:
        return torch.randn(shape, dtype=torch.float64, device=device)
    return torch.from_numpy(np.asarray(np.random.RandomState(int(seed)).standard_normal(tuple(shape)))).to(device)


def _shape(shape):
    if shape is None:
        raise OnnxGradError("random generator needs a shape attribute")
    return [int(s) for s in shape]


@describe("RandomUniform", no_gradient="no inputs")
@register("RandomUniform", since=1)
def random_uniform(*, shape=None, dtype=1, high=1.0, low=0.0, seed=None, device, float_dtype=None):
    u = _uniform(_shape(shape), seed, device)
    return (u * (high - low) + low).to(_dtype(dtype, float_dtype=float_dtype))


@describe("RandomNormal", no_gradient="no inputs")
@register("RandomNormal", since=1)
def random_normal(*, shape=None, dtype=1, mean=0.0, scale=1.0, seed=None, device, float_dtype=None):
    z = _normal(_shape(shape), seed, device)
    return (z * scale + mean).to(_dtype(dtype, float_dtype=float_dtype))


@describe("RandomUniformLike", no_gradient="a sample: only the input's shape and type count")
@register("RandomUniformLike", since=1)
def random_uniform_like(x, *, dtype=None, high=1.0, low=0.0, seed=None, float_dtype=None):
    u = _uniform(list(x.shape), seed, x.device)
    return (u * (high - low) + low).to(_dtype(dtype, x, float_dtype))


@describe("RandomNormalLike", no_gradient="a sample: only the input's shape and type count")
@register("RandomNormalLike", since=1)
def random_normal_like(x, *, dtype=None, mean=0.0, scale=1.0, seed=None, float_dtype=None):
    z = _normal(list(x.shape), seed, x.device)
    return (z * scale + mean).to(_dtype(dtype, x, float_dtype))


@describe("Bernoulli", needs="", rule="dX = 0                     # a sample: flat in its probabilities")
@register("Bernoulli", since=15)
def bernoulli(x, *, dtype=None, seed=None, float_dtype=None):
    p = x.detach().to(torch.float64)
    u = _uniform(list(x.shape), seed, x.device)
    # numpy's legacy binomial(1, p), which the reference uses, is this test on one uniform draw.
    hit = torch.where(p <= 0.5, u > 1.0 - p, u <= p)
    return hit.to(_dtype(dtype, x, float_dtype))


@describe("Multinomial", no_gradient="an integer result (the sampled classes)")
@register("Multinomial", since=7)
def multinomial(x, *, dtype=6, sample_size=1, seed=None):
    if x.dim() != 2:
        raise OnnxGradError(f"Multinomial needs (batch, classes) log-probabilities, got shape {list(x.shape)}")
    cdf = torch.softmax(x.detach().to(torch.float64), -1).cumsum(-1)
    u = _uniform([x.shape[0], sample_size], seed, x.device)
    # Inverse-CDF sampling: the class whose cumulative probability first exceeds u.
    picks = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=x.shape[1] - 1)
    return picks.to(onnx_to_torch(dtype))
