"""Optimizer steps of the ai.onnx.preview.training domain: Momentum, Adagrad and Adam.

Inputs are R (learning rate), T (step count), then the tensors to optimize, their gradients and
their optimizer states, each group of the same length: X1..Xn, G1..Gn, V1..Vn (and H1..Hn).
Outputs are the new X1..Xn followed by the new states."""
from __future__ import annotations

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register

DOMAIN = "ai.onnx.preview.training"


def _groups(op, tensors, n_groups):
    if not tensors or len(tensors) % n_groups:
        raise OnnxGradError(f"{op}: expected {n_groups} equal groups of tensors after R and T, got {len(tensors)}")
    n = len(tensors) // n_groups
    return [tensors[k * n:(k + 1) * n] for k in range(n_groups)]


def _step(t):
    return int(t.reshape(-1)[0])


@describe("Momentum", domain=DOMAIN, needs="in",
          rule=("dR = the update's derivative in the rate R",
                None,
                "dinputs = dX_new, dV_new sent back through the {mode} update: V_new = {alpha}·V + {beta}·Ĝ, Ĝ = G + "
                "{norm_coefficient}·X"))
@register("Momentum", domain=DOMAIN, since=1)
def momentum(r, t, *tensors, alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise UnsupportedOpError(f"Momentum: mode {mode!r} is not supported (use standard or nesterov)")
    xs, gs, vs = _groups("Momentum", tensors, 3)
    # The first step (T = 0) takes the whole gradient, whatever beta says.
    b = beta if _step(t) > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm_coefficient * x + g
        v = alpha * v + b * g
        new_x.append(x - r * (v if mode == "standard" else g + alpha * v))
        new_v.append(v)
    return tuple(new_x + new_v)


@describe("Adagrad", domain=DOMAIN, needs="in",
          rule=("dR = the update's derivative in the rate r = R / (1 + T·{decay_factor})",
                None,
                "dinputs = dX_new, dH_new sent back through H_new = H + Ĝ², X_new = X − r·Ĝ / (√H_new + {epsilon}), Ĝ = G + "
                "{norm_coefficient}·X"))
@register("Adagrad", domain=DOMAIN, since=1)
def adagrad(r, t, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    xs, gs, hs = _groups("Adagrad", tensors, 3)
    rate = r / (1 + t.to(r.dtype) * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = norm_coefficient * x + g
        h = h + g * g
        new_x.append(x - rate * g / (torch.sqrt(h) + epsilon))
        new_h.append(h)
    return tuple(new_x + new_h)


@describe("Adam", domain=DOMAIN, needs="in",
          rule=("dR = the update's derivative in the rate R",
                None,
                "dinputs = dX_new, dV_new, dH_new sent back through V_new = {alpha}·V + (1 − {alpha})·Ĝ, H_new = {beta}·H + (1 "
                "− {beta})·Ĝ² and the bias-corrected step"))
@register("Adam", domain=DOMAIN, since=1)
def adam(r, t, *tensors, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    xs, gs, vs, hs = _groups("Adam", tensors, 4)
    step = _step(t)
    rate = r * ((1 - beta ** step) ** 0.5 / (1 - alpha ** step)) if step > 0 else r
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = norm_coefficient * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        new_x.append((1 - norm_coefficient_post) * (x - rate * v / (torch.sqrt(h) + epsilon)))
        new_v.append(v)
        new_h.append(h)
    return tuple(new_x + new_v + new_h)
