"""How far apart two values may be before a node is said to diverge: errors are relative to the value's
scale (max |a − b| / max(max |a|, max |b|)); a tolerance is in units of the lower precision's epsilon,
widened by the node's reduction length (a MatMul's inner dimension, a ReduceSum's span) because each of
the terms it adds carries its own rounding. docs/diff.md states the rule."""
from __future__ import annotations

import math

import torch

# A node's own rounding, in epsilons of the lower precision: rounding its inputs and computing in
# the half type stays within a few; an initializer scaled by 1.01 in float32 is ~80 000 epsilons away.
UNITS = 8.0
TINY = 1e-30


def eps_of(dtype: torch.dtype) -> float:
    """The machine epsilon of a float dtype; integers and bools compare exactly."""
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def eps_of_dtypes(*dtypes) -> float:
    """The largest epsilon among `dtypes` (None for a value not seen)."""
    return max((eps_of(d) for d in dtypes if d is not None), default=0.0)


def eps_of_values(*values) -> float:
    """The largest epsilon among the tensors of `values` (anything else ignored)."""
    return eps_of_dtypes(*(v.dtype for v in values if isinstance(v, torch.Tensor)))


def reduction_length(inputs, outputs) -> float:
    """How many terms each output element sums at most, as its inputs' size over its output's: a
    MatMul's K, a ReduceMean's span, 1 for an elementwise op."""
    n_in = max((t.numel() for t in inputs if isinstance(t, torch.Tensor)), default=1)
    n_out = max((t.numel() for t in outputs if isinstance(t, torch.Tensor)), default=1)
    return max(1.0, n_in / max(n_out, 1))


# Ops that sum along a row of their input and scale every element by it: their output is the input's
# size, but each element (and each gradient element) carries a whole row's rounding.
ROW_OPS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "SkipLayerNormalization",
                     "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
                     "GroupNormalization", "InstanceNormalization", "BatchNormalization", "Attention",
                     "MultiHeadAttention"})


def row_length(op_type: str, values) -> float:
    """The row a ROW_OPS op normalizes over: its input's last dim (1 for any other op)."""
    if op_type.split("+")[-1] not in ROW_OPS:
        return 1.0
    return float(max((t.shape[-1] for t in values if isinstance(t, torch.Tensor) and t.dim()), default=1))


def tolerance(eps: float, reduction: float = 1.0) -> float:
    """UNITS epsilons, widened by log2 of the reduction length (pairwise and blocked sums grow their
    rounding with the depth of the sum tree, not with its length)."""
    return UNITS * eps * (1.0 + math.log2(max(reduction, 1.0)))


# Ops whose values lie within [-1, 1] by definition: errors are measured against that range, so that
# outputs deep in a tail (a Sigmoid of -11 is 1.7e-5) are not judged digit by digit; onnxruntime's
# fast Sigmoid is exact to 1.3e-7 absolute, not relative.
BOUNDED_OPS = frozenset({"Sigmoid", "Tanh", "Erf", "Softmax", "HardSigmoid", "Softsign"})


def inner_length(op_type: str, inputs) -> float:
    """How many products a MatMul/Gemm (A's last dim) or a Conv (a filter's size) adds per output."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if op_type in ("MatMul", "Gemm", "FusedMatMul", "MatMulInteger") and tensors and tensors[0].dim():
        return float(max(tensors[0].shape[-1], tensors[0].shape[0]))
    if op_type in ("Conv", "ConvTranspose", "ConvInteger") and len(tensors) > 1 and tensors[1].dim():
        return float(tensors[1].numel() / max(tensors[1].shape[0], 1))
    return 1.0


CHUNK = 1 << 20


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf, in one pass and no temporary: min and max propagate NaN (an embedding table's
    isfinite mask alone would be a quarter of its float32 bytes)."""
    if not t.is_floating_point() or not t.numel():
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def largest(t: torch.Tensor) -> float:
    """max |t| without materializing |t|."""
    lo, hi = torch.aminmax(t)
    return max(abs(float(lo)), abs(float(hi)))


def _max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| in float64, a million elements at a time: an embedding table compared whole in
    float64 would hold three copies of itself at twice its width."""
    a, b = a.reshape(-1), b.reshape(-1)
    return max(float((a[k:k + CHUNK].to(torch.float64) - b[k:k + CHUNK].to(torch.float64)).abs().max())
               for k in range(0, a.numel(), CHUNK))


def relative_error(a: torch.Tensor, b: torch.Tensor, saturate: bool = False, floor: float = TINY) -> float:
    """max |a − b| over the value's scale; inf where one side is NaN/Inf and the other is not (or a
    shape differs), 0 where both hold the same non-finite values. `saturate`: b's ±inf where a lies
    beyond b's dtype's range, with a's sign, is a's value as b's dtype holds it (a mask's -3.4e38
    is float16's -inf), not an error."""
    if a.shape != b.shape:
        return math.inf
    if not (a.is_floating_point() or b.is_floating_point()):
        return 0.0 if torch.equal(a, b.to(a.dtype)) else math.inf
    a, b = a.detach(), b.detach()
    if not a.numel():
        return 0.0
    if all_finite(a) and all_finite(b):  # the common case, fast
        diff = _max_abs_difference(a, b)
        return diff / max(largest(a), largest(b), floor) if diff else 0.0
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    if saturate and b.is_floating_point():
        top = float(torch.finfo(b.dtype).max)
        a64 = torch.where(a64.abs() > top, a64.sign() * math.inf, a64)
    fa, fb = torch.isfinite(a64), torch.isfinite(b64)
    same_nonfinite = (~fa) & (~fb) & ((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
    if bool(((fa != fb) | ((~fa) & ~same_nonfinite)).any()):
        return math.inf
    both = fa & fb
    if not bool(both.any()):
        return 0.0
    diff = float((a64[both] - b64[both]).abs().max())
    scale = max(float(a64[both].abs().max()), float(b64[both].abs().max()), floor)
    return diff / scale if diff else 0.0
