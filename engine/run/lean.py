"""Relu and Conv steps that keep less for the backward pass than torch's own autograd does.

In a gradient by one weight deep in a CNN, nearly every saved tensor is a float activation kept
twice over: torch's Relu keeps its output (for the mask of where it passed the gradient) and the
Conv that reads that output keeps it again as its input, although the input's gradient needs only
the weight and the input's shape. Measured on timm resnet50 at 224x224 (docs/benchmarks.md,
"Pretrained-size models"), those activations are 35 MB of a 0.10 GB model's peak. Here Relu keeps
a one-byte mask, and Conv, when neither its weight nor its bias wants a gradient, keeps only its
weight; a Conv whose output only a Relu reads is joined with it (rectified in place: one
activation allocated, not two). The gradients are computed by the kernels torch's autograd calls
(threshold_backward on a bool mask; aten.convolution_backward with an input of the right
shape and no values, as torch.nn.grad.conv*d_input does): on the CPU they are the same bits
(tests/run/test_lean.py); elsewhere the plain ops run.

`Plan` swaps these in for the run that is differentiated once (`Plan.run`, the steps
`run_steps`); a run whose gradient is differentiated again (`create_graph`, nested Gradient
nodes) keeps the plain ops. Outside a gradient (no grad mode, inputs without grad) each is the
plain op, the joined pair rectifying the convolution's fresh output in place. Off unless
`ONNXGRAD_LEAN=1` (or `Plan(..., lean_autograd=True)`): see `LEAN`.
"""
from __future__ import annotations

import os

import torch

from ..ops import activation, conv
from .fusion import RAW_FN, RAW_IN, RAW_KW, RAW_OUT, slot_readers

# Opt-in: on resnet50 (one 224x224 image) it cuts the live peak by 20 MB, but glibc's heap keeps
# the freed activations' pages either way (peak RSS 200-206 MB against 201-215), and the masks and
# the shape-only input's materialisation cost ~12% of the gradient's CPU time (docs/benchmarks.md).
LEAN = os.environ.get("ONNXGRAD_LEAN", "0") == "1"


def _passed(y: torch.Tensor) -> torch.Tensor:
    """Where Relu's output y lets the gradient through, as torch's threshold_backward(grad, y, 0)
    decides (0 where y <= 0, so a NaN passes); threshold_backward reads the bool mask the same way,
    in the same time (masked_fill and where take four times as long)."""
    return torch.le(y, 0).logical_not_()


class _ReluMasked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.save_for_backward(_passed(y))
        return y

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.aten.threshold_backward(grad, ctx.saved_tensors[0], 0)


def relu(x, **attrs):
    if torch.is_grad_enabled() and x.requires_grad and x.is_floating_point() and x.device.type == "cpu":
        return _ReluMasked.apply(x)
    return activation.relu(x, **attrs)


def _input_grad(ctx, grad):
    """The gradient of a convolution by its input (ctx: the weight saved, geometry, input shape)."""
    w = ctx.saved_tensors[0]
    g = ctx.geometry
    shape_only = grad.new_empty(1).expand(ctx.input_shape)
    return torch.ops.aten.convolution_backward(
        grad, shape_only, w, None, g["stride"], g["padding"], g["dilation"], False, [0] * (len(ctx.input_shape) - 2),
        g["groups"], (True, False, False))[0]


class _ConvByInput(torch.autograd.Function):
    """A convolution differentiated by its input only: keeps the weight and the input's shape."""

    @staticmethod
    def forward(ctx, x, w, b, geometry):
        ctx.save_for_backward(w)
        ctx.geometry, ctx.input_shape = geometry, x.shape
        return conv.convolve(x, w, b, geometry)

    @staticmethod
    def backward(ctx, grad):
        return _input_grad(ctx, grad), None, None, None


class _ConvReluByInput(torch.autograd.Function):
    """Relu(Conv(x)) differentiated by x only: the convolution's output is rectified in place,
    and what is kept is the weight, x's shape and the Relu's mask."""

    @staticmethod
    def forward(ctx, x, w, b, geometry):
        y = conv.convolve(x, w, b, geometry).relu_()
        ctx.save_for_backward(w, _passed(y))
        ctx.geometry, ctx.input_shape = geometry, x.shape
        return y

    @staticmethod
    def backward(ctx, grad):
        return _input_grad(ctx, torch.ops.aten.threshold_backward(grad, ctx.saved_tensors[1], 0)), None, None, None


def _by_input_only(x, w, b) -> bool:
    """Autograd records this Conv, for x's gradient only, on the CPU (where the gradients were
    checked to be torch's own bits; a GPU library may pick another algorithm for a shape-only input)."""
    return (torch.is_grad_enabled() and x.requires_grad and not w.requires_grad and (b is None or not b.requires_grad)
            and x.device.type == "cpu")


def conv_step(x, w, b=None, **attrs):
    if _by_input_only(x, w, b):
        x, geometry = conv.conv_geometry(x, w, **attrs)
        return _ConvByInput.apply(x, w, b, geometry)
    return conv.conv(x, w, b, **attrs)


def conv_relu_step(x, w, b=None, **attrs):
    """A Conv whose output only a Relu reads, and that Relu."""
    if _by_input_only(x, w, b):
        x, geometry = conv.conv_geometry(x, w, **attrs)
        return _ConvReluByInput.apply(x, w, b, geometry)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return relu(conv.conv(x, w, b, **attrs))
    return conv.conv(x, w, b, **attrs).relu_()  # no autograd, and nothing else reads the convolution


SWAPS = {activation.relu: relu, conv.conv: conv_step}


def lean_steps(steps: list, protected: set[int]) -> list:
    """`steps` (raw step lists) with Relu and Conv replaced by the lean versions, and a Conv whose
    output only a Relu reads (and is none of `protected`) joined with it; the same list when there
    is neither."""
    if not any(st[RAW_FN] in SWAPS for st in steps):
        return steps
    readers = slot_readers(steps)  # a Relu reads one slot: a Conv output read twice is never joined
    joined: dict[int, int] = {}  # Conv step -> the Relu step joined to it
    for k, st in enumerate(steps):
        out = st[RAW_OUT]
        if st[RAW_FN] is conv.conv and len(out) == 1 and out[0] is not None and out[0] not in protected:
            only = readers.get(out[0], [])
            if len(only) == 1 and steps[only[0]][RAW_FN] is activation.relu:
                joined[k] = only[0]
    relus = set(joined.values())
    lean = []
    for k, st in enumerate(steps):
        if k in relus:
            continue
        if k in joined:  # at the Conv's place: the Relu reads nothing else, its readers all come later
            lean.append([st[0], st[1], "ConvRelu", conv_relu_step, st[RAW_IN], steps[joined[k]][RAW_OUT], st[RAW_KW]])
        elif st[RAW_FN] in SWAPS:
            lean.append(st[:RAW_FN] + [SWAPS[st[RAW_FN]]] + st[RAW_FN + 1:])
        else:
            lean.append(st)
    return lean
