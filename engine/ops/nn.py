"""Matrix products (and Det), normalizations, Dropout and LRN."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..dtypes import computes_in_float32
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .tangents import differentiated


@describe("MatMul", needs="in",
          rule=("dA = dY @ Bᵀ   (summed over broadcast batch dims)",
                "dB = Aᵀ @ dY   (summed over broadcast batch dims)"))
@register("MatMul", since=1)
def matmul(a, b):
    if b.dim() == 2 and a.dim() > 2 and not a.is_contiguous():
        # torch folds a's batch dims into one mm only when a view does it; otherwise (a transposed
        # activation: exported batch_first attention) it runs a bmm over b expanded per batch, forward
        # and backward, which costs more than this copy (the ms encoder layer: ~80 us of a 2 ms call).
        a = a.contiguous()
    return torch.matmul(a, b)


@describe("MatMulInteger", no_gradient="an integer result")
@register("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    a = a.to(torch.int64)
    b = b.to(torch.int64)
    if a_zero_point is not None:
        zp = a_zero_point.to(torch.int64)
        # A 1-D zero point of A is per row (length M).
        a = a - (zp.reshape(-1, 1) if zp.dim() == 1 and zp.numel() > 1 else zp)
    if b_zero_point is not None:
        b = b - b_zero_point.to(torch.int64)
    return torch.matmul(a, b).to(torch.int32)


@describe("Det", needs="in0,out0", rule="dX = dY · cofactor(X)     # det(X) · X⁻ᵀ where X is invertible")
@register("Det", since=11)
@computes_in_float32  # NOTE: torch's CPU LU factorization has no half kernel
def det(x):
    return torch.linalg.det(x)


# Y = alpha · op(A) · op(B) + beta · C, op() transposing where the flag is set: one variant per (transA, transB).
_GEMM_RULES = {
    (0, 0): ("dA = {alpha·}dY · Bᵀ", "dB = {alpha·}Aᵀ · dY", "dC = {beta·}unbroadcast(dY)"),
    (1, 0): ("dA = {alpha·}B · dYᵀ", "dB = {alpha·}A · dY", "dC = {beta·}unbroadcast(dY)"),
    (0, 1): ("dA = {alpha·}dY · B", "dB = {alpha·}dYᵀ · A", "dC = {beta·}unbroadcast(dY)"),
    (1, 1): ("dA = {alpha·}Bᵀ · dYᵀ", "dB = {alpha·}dYᵀ · Aᵀ", "dC = {beta·}unbroadcast(dY)"),
}


@describe("Gemm", needs="in0,in1", rule=_GEMM_RULES, rule_by=("transA", "transB"))  # C enters linearly
@register("Gemm", since=1)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    a = a.transpose(0, 1) if transA else a
    b = b.transpose(0, 1) if transB else b
    if c is not None and c.dtype == a.dtype and a.is_floating_point():
        # One fused kernel (and one backward node), as torch's own Linear does.
        return torch.addmm(c, a, b, beta=beta, alpha=alpha)
    y = torch.matmul(a, b)
    if alpha != 1.0:
        y = alpha * y
    if c is not None:
        y = y + (beta * c if beta != 1.0 else c)
    return y.to(a.dtype)


@describe("Einsum", needs="in", rule=("dXᵢ = Einsum(dY and the other operands -> operand i's subscripts)",))
@register("Einsum", since=12)
def einsum(*inputs, equation):
    return torch.einsum(equation.replace(" ", ""), *inputs)


def _channel(t, rank):
    return t.reshape([-1] + [1] * (rank - 2))


def _stash(x, stash_type=1):
    """Statistics dtype: stash_type 1 lifts half types to float32, never lowers float64."""
    if stash_type == 1 and x.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return x.dtype


def _fused_batch_norm(x, scale, b, mean, var, epsilon):
    """torch's one-kernel inference batch norm, or None when it would change the math.

    NOTE: F.batch_norm treats running statistics as constants, so it is used only when no
    gradient is wanted for mean and var; otherwise the formula below differentiates them too.
    """
    if x.dtype not in (torch.float32, torch.float64) or x.dim() < 2 or differentiated(mean) or differentiated(var):
        return None
    if not all(t.dim() == 1 and t.dtype == x.dtype for t in (scale, b, mean, var)):
        return None
    return torch.nn.functional.batch_norm(x, mean, var, scale, b, False, 0.0, epsilon)


def _moments(x, dims):
    mean = x.mean(dim=dims, keepdim=True)
    var = (x - mean).square().mean(dim=dims, keepdim=True)
    return mean, var


@register("BatchNormalization", since=1, until=13)
def batch_norm_legacy(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, is_test=0,
                      consumed_inputs=None, n_outputs=1):
    # NOTE: old opsets default to is_test=0, yet nearly every exported model is an inference
    # graph with one output; training statistics are produced only when extra outputs are declared.
    rank = x.dim()
    param = (lambda t: _channel(t, rank)) if spatial else (lambda t: t)
    if n_outputs == 1:
        fused = _fused_batch_norm(x, scale, b, mean, var, epsilon) if spatial else None
        if fused is not None:
            return fused
        return param(scale) * (x - param(mean)) / torch.sqrt(param(var) + epsilon) + param(b)
    dims = tuple(d for d in range(rank) if d != 1) if spatial else (0,)
    bmean, bvar = _moments(x, dims)
    y = param(scale) * (x - bmean) / torch.sqrt(bvar + epsilon) + param(b)
    bmean, bvar = bmean.reshape(mean.shape), bvar.reshape(var.shape)
    run_mean = mean * momentum + bmean * (1 - momentum)
    run_var = var * momentum + bvar * (1 - momentum)
    # NOTE: the spec leaves saved_var loose; like onnxruntime it is the inverse standard deviation.
    return (y, run_mean, run_var, bmean, torch.rsqrt(bvar + epsilon))[:n_outputs]


@describe("BatchNormalization", needs="in0,in1,in3,in4",
          rule=("dX = dY · scale / sqrt(var + {epsilon})   # inference: mean and var fixed",
                "dscale = Σ dY · (X − mean) / sqrt(var + {epsilon})",
                "dB = Σ dY over N and the spatial axes",
                "dmean = −Σ dY · scale / sqrt(var + {epsilon})",
                "dvar = −½ Σ dY · scale · (X − mean) · (var + {epsilon})^(−3/2)"))
@register("BatchNormalization", since=14)
def batch_norm(x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0,
               n_outputs=1):
    rank = x.dim()
    if not training_mode:
        y = _fused_batch_norm(x, scale, b, input_mean, input_var, epsilon) if n_outputs == 1 else None
        if y is not None:
            return y
        y = _channel(scale, rank) * (x - _channel(input_mean, rank)) / torch.sqrt(
            _channel(input_var, rank) + epsilon) + _channel(b, rank)
        return y if n_outputs == 1 else (y, input_mean, input_var)[:n_outputs]
    # NOTE: training mode normalizes with the biased batch variance, as the ONNX reference does.
    bmean, bvar = _moments(x, tuple(d for d in range(rank) if d != 1))
    y = _channel(scale, rank) * (x - bmean) / torch.sqrt(bvar + epsilon) + _channel(b, rank)
    run_mean = input_mean * momentum + bmean.reshape(-1) * (1 - momentum)
    run_var = input_var * momentum + bvar.reshape(-1) * (1 - momentum)
    return y if n_outputs == 1 else (y, run_mean, run_var)[:n_outputs]


@describe("InstanceNormalization", needs="in0,in1",
          rule=("dinput = (dX̂ − mean(dX̂) − X̂ · mean(dX̂ · X̂)) / σ over the spatial axes   with dX̂ = dY · scale",
                "dscale = Σ dY · X̂ over N and the spatial axes",
                "dB = Σ dY over N and the spatial axes"))
@register("InstanceNormalization", since=1)
def instance_norm(x, scale, b, *, epsilon=1e-5, consumed_inputs=None):
    mean, var = _moments(x, tuple(range(2, x.dim())))
    return _channel(scale, x.dim()) * (x - mean) / torch.sqrt(var + epsilon) + _channel(b, x.dim())


@describe("LayerNormalization", needs="in0,in1",
          rule=("dX = (dX̂ − mean(dX̂) − X̂ · mean(dX̂ · X̂)) / σ   with dX̂ = dY · scale",
                "dscale = Σ dY · X̂ over the leading axes",
                "dB = Σ dY over the leading axes"))
@register("LayerNormalization", since=17)
def layer_norm(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1, n_outputs=1):
    rank = x.dim()
    axis = axis + rank if axis < 0 else axis
    normalized = tuple(x.shape[axis:])
    if (n_outputs == 1 and x.dtype in (torch.float32, torch.float64) and tuple(scale.shape) == normalized
            and (b is None or tuple(b.shape) == normalized)):
        return torch.nn.functional.layer_norm(x, normalized, scale, b, epsilon)  # one fused kernel
    xs = x.to(_stash(x, stash_type))
    mean, var = _moments(xs, tuple(range(axis, rank)))
    inv_std = torch.rsqrt(var + epsilon)
    y = ((xs - mean) * inv_std).to(x.dtype) * scale
    if b is not None:
        y = y + b
    return y if n_outputs == 1 else (y, mean, inv_std)[:n_outputs]


@describe("RMSNormalization", needs="in0,in1",
          rule=("dX = r · (dŶ − Ŷ · mean(dŶ · Ŷ))   with dŶ = dY · scale, Ŷ = X · r, r = 1 / √(mean(X²) + {epsilon})",
                "dscale = Σ dY · Ŷ over the leading axes"))
@register("RMSNormalization", since=23)
def rms_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    axis = axis + x.dim() if axis < 0 else axis
    xs = x.to(_stash(x, stash_type))
    ms = xs.square().mean(dim=tuple(range(axis, x.dim())), keepdim=True)
    return (xs * torch.rsqrt(ms + epsilon)).to(x.dtype) * scale


def _group_norm(x, scale, bias, epsilon, num_groups, stash_type, per_group_params):
    n, c = x.shape[0], x.shape[1]
    if c % num_groups:
        raise OnnxGradError(f"GroupNormalization: {c} channels are not divisible by num_groups={num_groups}")
    xs = x.to(_stash(x, stash_type))
    g = xs.reshape(n, num_groups, -1)
    mean, var = _moments(g, (2,))
    y = ((g - mean) / torch.sqrt(var + epsilon)).reshape(x.shape).to(x.dtype)
    if per_group_params:
        scale = scale.repeat_interleave(c // num_groups)
        bias = bias.repeat_interleave(c // num_groups)
    return _channel(scale, x.dim()) * y + _channel(bias, x.dim())


@register("GroupNormalization", since=18, until=20)
def group_norm_18(x, scale, bias, *, epsilon=1e-5, num_groups):
    # NOTE: opset 18 gives scale and bias per group, opset 21 per channel.
    return _group_norm(x, scale, bias, epsilon, num_groups, 1, per_group_params=True)


@describe("GroupNormalization", needs="in0,in1",
          rule=("dX = (dX̂ − mean(dX̂) − X̂ · mean(dX̂ · X̂)) / σ per group   with dX̂ = dY · scale",
                "dscale = Σ dY · X̂ over N and the spatial axes",
                "dbias = Σ dY over N and the spatial axes"))
@register("GroupNormalization", since=21)
def group_norm(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    return _group_norm(x, scale, bias, epsilon, num_groups, stash_type, per_group_params=False)


@describe("MeanVarianceNormalization", needs="in0,out0", rule="dX = (dY − mean(dY) − Y · mean(dY · Y)) / σ   # over axes {axes}")
@register("MeanVarianceNormalization", since=9)
def mean_variance_norm(x, *, axes=(0, 2, 3)):
    mean, var = _moments(x, tuple(a % x.dim() for a in axes))
    # NOTE: epsilon is added to the standard deviation (not the variance): constant slices
    # have an infinite derivative through sqrt at 0.
    return (x - mean) / (torch.sqrt(var) + 1e-9)


@describe("LpNormalization", needs="in0,out0",
          rule="dX = (dY − N′ · Σ_axis(dY · Y)) / ‖X‖   # p = {p}: N′ = Y (p = 2) or sign(X) (p = 1); axis {axis}")
@register("LpNormalization", since=1)
def lp_norm(x, *, axis=-1, p=2):
    if p not in (1, 2):
        raise UnsupportedOpError(f"LpNormalization: p={p} is not supported (ONNX allows 1 or 2)")
    axis = axis % x.dim()
    norm = torch.linalg.vector_norm(x, ord=p, dim=axis, keepdim=True)
    # NOTE: an all-zero slice maps to 0 (the ONNX reference's 0/0 = 0), with zero gradient.
    return x / torch.where(norm == 0, torch.ones_like(norm), norm)


@describe("LRN", needs="in0,out0",
          rule="dX = dY / s^β − 2αβ/n · X · Σ_window(dY · Y / s)   # s = {bias} + α/n · Σ_window X², α = {alpha}, β = {beta}, n "
               "= {size}")
@register("LRN", since=1)
def lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).movedim(1, -1)
    sums = F.pad(sq, (lo, hi)).unfold(sq.dim() - 1, size, 1).sum(-1).movedim(-1, 1)
    return x / (bias + (alpha / size) * sums).pow(beta)


def _dropout_mask_ones(x, n_outputs, mask_dtype):
    return x if n_outputs == 1 else (x, torch.ones(x.shape, dtype=mask_dtype, device=x.device))


@register("Dropout", since=1, until=9)
def dropout_legacy(x, *, ratio=0.5, is_test=0, consumed_inputs=None, n_outputs=1):
    # Inference only: these opsets have no training switch that an inference graph would set.
    return _dropout_mask_ones(x, n_outputs, x.dtype)


@register("Dropout", since=10, until=11)
def dropout_10(x, *, ratio=0.5, n_outputs=1):
    return _dropout_mask_ones(x, n_outputs, torch.bool)


@describe("Dropout", needs="out1", rule="dX = dY · mask / (1 − ratio)   # identity in inference mode")
@register("Dropout", since=12)
def dropout(x, ratio=None, training_mode=None, *, seed=None, n_outputs=1):
    if training_mode is None or not bool(training_mode.item()):
        return _dropout_mask_ones(x, n_outputs, torch.bool)
    ratio = torch.as_tensor(0.5, dtype=x.dtype, device=x.device) if ratio is None else ratio
    if seed is not None:
        # A seeded draw matches the ONNX reference implementation's RandomState stream exactly.
        u = torch.from_numpy(np.random.RandomState(seed).uniform(0, 1.0, tuple(x.shape))).to(x.device)
    else:
        u = torch.rand(x.shape, dtype=torch.float64, device=x.device)
    mask = u >= ratio
    # NOTE: the random mask is a constant for differentiation; ratio's gradient flows only via 1/(1-ratio).
    y = torch.where(mask, x / (1 - ratio), torch.zeros_like(x))
    return y if n_outputs == 1 else (y, mask)
