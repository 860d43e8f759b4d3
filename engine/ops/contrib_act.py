"""onnxruntime's com.microsoft fused activations and matmuls: Gelu, BiasGelu, FastGelu, QuickGelu,
BiasAdd, BiasSplitGelu, GemmFastGelu, FusedMatMul and FusedConv.

The specification is onnxruntime's docs/ContribOperators.md and its kernels; where the two differ the
kernel wins and a NOTE says so. Each is the composition of standard ops the optimizer fused, so the
backward is torch autograd through that composition.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register, validates
from .conv import conv

MS = "com.microsoft"


def _tanh_gelu(x):
    # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the kernels' formula (torch's tanh approximation).
    return F.gelu(x, approximate="tanh")


@describe("Gelu", domain=MS, needs="in0", rule=("dX = dY · (Φ(X) + X · φ(X))   # Φ, φ the normal CDF and density",))
@register("Gelu", domain=MS, since=1)
def gelu(x):
    return F.gelu(x)


def _bias_of_last_axis(ins, x: str, bias: str) -> None:
    """onnxruntime's bias_gelu_helper: the bias is 1-D, as wide as the input's last axis."""
    if ins.given(bias):
        ins.width(bias, ins.shape(x)[-1], f"the last dim of {x}")


@validates("BiasGelu", domain=MS)
def _bias_gelu_inputs(ins, **_):
    _bias_of_last_axis(ins, "A", "B")


@describe("BiasGelu", domain=MS, needs="in", rule=("dA = dY · Gelu′(A + B)", "dB = Σ over the leading axes of dY · Gelu′(A + B)"))
@register("BiasGelu", domain=MS, since=1)
def bias_gelu(a, b):
    return F.gelu(a + b)


@validates("FastGelu", domain=MS)
def _fast_gelu_inputs(ins, **_):
    _bias_of_last_axis(ins, "X", "bias")


@describe("FastGelu", domain=MS, needs="in",
          rule=("dX = dY · FastGelu′(X + bias)   # the derivative of the tanh approximation",
                "dbias = Σ over the leading axes of dY · FastGelu′(X + bias)"))
@register("FastGelu", domain=MS, since=1)
def fast_gelu(x, bias=None):
    return _tanh_gelu(x if bias is None else x + bias)


@describe("QuickGelu", domain=MS, needs="in0", rule=("dX = dY · σ(αX) · (1 + αX · (1 − σ(αX)))   # α = {alpha}",))
@register("QuickGelu", domain=MS, since=1)
def quick_gelu(x, *, alpha=1.702):
    return x * torch.sigmoid(alpha * x)


@validates("BiasAdd", domain=MS)
def _bias_add_inputs(ins, **_):
    _, _, channels = ins.rank("X", 3, layout="N, S, C")
    ins.width("bias", channels, "X's dim 2")
    if ins.shape("skip") != ins.shape("X"):
        ins.fail("skip", f"expected X's shape {list(ins.shape('X'))}")


@describe("BiasAdd", domain=MS, needs="", rule=("dX = dY", "dbias = Σ dY over N and S", "dskip = dY"))
@register("BiasAdd", domain=MS, since=1)
def bias_add(x, bias, skip):
    # NOTE: onnxruntime has this kernel on CUDA only (channels 320/640/1280 or a generic loop); any C is taken here.
    return x + bias + skip


@validates("BiasSplitGelu", domain=MS)
def _bias_split_gelu_inputs(ins, **_):
    _, _, width = ins.rank("X", 3, layout="N, S, D")
    if width % 2:
        ins.fail("X", f"dim 2 is {width}, expected an even width (it is split in halves)")
    ins.width("bias", width, "X's dim 2")


@describe("BiasSplitGelu", domain=MS, needs="in",
          rule=("dX = [dY · Gelu(R), dY · L · Gelu′(R)]   # L, R the halves of X + bias",
                "dbias = Σ over N and S of dX"))
@register("BiasSplitGelu", domain=MS, since=1)
def bias_split_gelu(x, bias):
    # NOTE: the CUDA kernel (the only one) takes D/2 in 1280, 2560, 5120; any even D is taken here.
    left, right = (x + bias).chunk(2, -1)
    return left * F.gelu(right)  # the kernel: Gelu on the right half only


@validates("GemmFastGelu", domain=MS)
def _gemm_fast_gelu_inputs(ins, **_):
    x = ins.shape("X")
    ins.rank("W", 2, layout="K, N")
    ins.dim("W", 0, x[-1], "K, X's last dim")
    ins.width("bias", ins.shape("W")[1], "N, W's dim 1")


@describe("GemmFastGelu", domain=MS, needs="in",
          rule=("dX = (dY · FastGelu′(Z)) · Wᵀ   # Z = X · W + bias",
                "dW = Xᵀ · (dY · FastGelu′(Z))",
                "dbias = Σ over the leading axes of dY · FastGelu′(Z)"))
@register("GemmFastGelu", domain=MS, since=1)
def gemm_fast_gelu(x, w, bias=None):
    # NOTE: onnxruntime has this kernel on ROCm only: FastGelu(MatMul(X, W) + bias).
    y = torch.matmul(x, w)
    return _tanh_gelu(y if bias is None else y + bias)


def _batch_moved(t, trans_batch, trans):
    """FusedMatMul's operand: transBatch moves the leading axis next to the last (the kernel's
    [d0, d1.., dk, n] -> [d1.., dk, d0, n]); trans then swaps the last two."""
    if trans_batch:
        t = t.permute(*range(1, t.dim() - 1), 0, t.dim() - 1)
    return t.transpose(-1, -2) if trans else t


@validates("FusedMatMul", domain=MS)
def _fused_matmul_inputs(ins, *, transA=0, transB=0, transBatchA=0, transBatchB=0, **_):
    a, b = ins.shape("A"), ins.shape("B")
    if (transBatchA or transBatchB) and (len(a) < 3 or len(a) != len(b)):
        ins.fail("B", f"has {len(b)} dims, expected A's {len(a)}, at least 3 (transBatchA/transBatchB)")
    # K: A's last axis (its first with transA, or the batch axis moved there); B's next to last likewise.
    k_a, k_b = _k_of(a, transA, transBatchA, False), _k_of(b, transB, transBatchB, True)
    if k_a != k_b:
        flags_a, flags_b = _k_flags("A", transA, transBatchA, a), _k_flags("B", transB, transBatchB, b)
        # lead with the operand whose flag, flipped, would give the other's K: the likelier wrong one
        b_first = _k_of(b, not transB, transBatchB, True) == k_a or _k_of(a, not transA, transBatchA, False) != k_b
        why = f"{flags_b} B's K dim {k_b}, {flags_a} A's {k_a}" if b_first else \
            f"{flags_a} A's K dim {k_a}, {flags_b} B's {k_b}"
        ins.fail("B", f"its K dim is {k_b}, expected {k_a} ({why})")
    if len(a) >= 3 and len(b) >= 3:
        batch_a = list(_batch_moved(torch.empty(a, device="meta"), transBatchA, 0).shape[:-2])
        batch_b = list(_batch_moved(torch.empty(b, device="meta"), transBatchB, 0).shape[:-2])
        if any(x != y and 1 not in (x, y) for x, y in zip(reversed(batch_a), reversed(batch_b))):
            ins.fail("B", f"transBatchA = {transBatchA} leaves A's batch dims {batch_a}, transBatchB = {transBatchB} "
                          f"B's {batch_b}: they do not broadcast")


def _k_of(shape, trans, trans_batch, right: bool) -> int:
    """The contracted dim of A (right False) or B under the flags, as the kernel moves and transposes them."""
    if len(shape) == 1:
        return shape[0]
    if right:
        return shape[-1] if trans else shape[0] if trans_batch else shape[-2]
    return (shape[0] if trans_batch else shape[-2]) if trans else shape[-1]


def _k_flags(name: str, trans, trans_batch, shape) -> str:
    """'transB = 0 makes', naming the flags that pick the operand's K (transBatch only where it does)."""
    picks = trans if name == "A" else not trans
    both = picks and trans_batch is not None and len(shape) >= 3
    return (f"trans{name} = {trans}, transBatch{name} = {trans_batch} make" if both
            else f"trans{name} = {trans} makes")


@describe("FusedMatMul", domain=MS, needs="in",
          rule=("dA = {alpha·}dY · op(B)ᵀ, moved back through transA / transBatchA",
                "dB = {alpha·}op(A)ᵀ · dY, moved back through transB / transBatchB"))
@register("FusedMatMul", domain=MS, since=1)
def fused_matmul(a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    # A 1-D operand is a vector, as in MatMul; transposing it is a no-op.
    a = _batch_moved(a, transBatchA, transA) if a.dim() > 1 else a
    b = _batch_moved(b, transBatchB, transB) if b.dim() > 1 else b
    y = torch.matmul(a, b)
    return y if alpha == 1.0 else y * alpha


def _leaky_relu(y, params):
    if len(params) != 1:
        raise OnnxGradError("FusedConv: activation LeakyRelu needs activation_params [alpha]")
    return F.leaky_relu(y, params[0])


def _clip(y, params):
    if len(params) != 2:
        raise OnnxGradError("FusedConv: activation Clip needs activation_params [min, max]")
    return torch.clamp(y, params[0], params[1])


def _hard_sigmoid(y, params):
    if len(params) != 2:
        raise OnnxGradError("FusedConv: activation HardSigmoid needs activation_params [alpha, beta]")
    return torch.clamp(params[0] * y + params[1], 0.0, 1.0)


# The kernel's MLAS activations and the parameters each reads from activation_params.
FUSED_ACTIVATIONS = {
    "Relu": lambda y, p: torch.relu(y),
    "Tanh": lambda y, p: torch.tanh(y),
    "Sigmoid": lambda y, p: torch.sigmoid(y),
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
    "HardSigmoid": _hard_sigmoid,
}


def fused_activation(op: str, activation, params):
    """The activation named by a fused op's attribute, as a function of the pre-activation."""
    if activation is None or activation == "":
        return lambda y: y
    if activation not in FUSED_ACTIVATIONS:
        raise UnsupportedOpError(f"{op}: activation {activation!r} is not supported "
                                 f"(use {', '.join(FUSED_ACTIVATIONS)})")
    fn = FUSED_ACTIVATIONS[activation]
    params = list(params or [])
    return lambda y: fn(y, params)


@validates("FusedConv", domain=MS)
def _fused_conv_inputs(ins, *, group=1, **_):
    """onnxruntime's ConvAttributes::ValidateInputShape: W (M, C/group, k...) against X (N, C, d...)."""
    x = ins.rank("X", 3, 4, 5, layout="N, C, spatial dims")
    ins.rank("W", len(x), layout=f"M, C/group, kernel dims: X's {len(x)}")
    ins.dim("W", 1, x[1] // group if group else x[1], f"X's channels {x[1]} / group {group}")
    ins.width("B", ins.shape("W")[0], "M, W's dim 0")


@describe("FusedConv", domain=MS, needs="in",
          rule=("dX = ConvTranspose(dY · act′, W)   # act = {activation}, act′ at conv + Z",
                "dW = correlate(X, dY · act′) summed over the batch",
                "dB = Σ dY · act′ over N and the spatial axes",
                "dZ = dY · act′"))
@register("FusedConv", domain=MS, since=1)
def fused_conv(x, w, b=None, z=None, *, activation=None, activation_params=None, auto_pad="NOTSET", dilations=None,
               group=1, kernel_shape=None, pads=None, strides=None):
    act = fused_activation("FusedConv", activation, activation_params)
    y = conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
             strides=strides)
    if z is not None:  # the Add the optimizer fused: summed before the activation
        if z.shape != y.shape:
            raise OnnxGradError(f"FusedConv: Z of shape {list(z.shape)} does not match the output {list(y.shape)} "
                                f"(strides {strides}, pads {pads}, dilations {dilations})")
        y = y + z
    return act(y)

