"""Elementwise math, comparisons, logic and activations."""
from __future__ import annotations

import torch

from ..registry import register


@register("Add", since=7)
def add(a, b):
    return a + b


@register("Mul", since=7)
def mul(a, b):
    return a * b


@register("Relu", since=6)
def relu(x):
    # NOTE: the derivative at exactly 0 is taken as 0, like torch and every framework.
    return torch.relu(x)
