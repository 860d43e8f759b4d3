"""onnxruntime's weight-quantized com.microsoft ops: MatMulNBits (2/4/8-bit blocked weights, what
MatMulNBitsQuantizer writes), GatherBlockQuantized (quantized embedding tables), DynamicQuantizeMatMul
and MatMulIntegerToFloat (what quantize_dynamic writes).

Quantized weights are integers, so no gradient reaches them; the gradient flows to the float
activations, and to float scales, zero points and biases as the exact derivative of the dequantized
formula (they are initializers, so constants, unless listed in xs). Packed sub-byte values are read
low bits first, as the kernels store them.
"""
from __future__ import annotations

import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register

MS = "com.microsoft"


def unpack_bits(packed, bits):
    """uint8 (…, n) -> integer values (…, n·8/bits), low bits first."""
    if bits == 8:
        return packed.to(torch.int32)
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.int32)
    values = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _check_bits(op, bits):
    if bits not in (2, 4, 8):
        raise UnsupportedOpError(f"{op}: bits={bits} is not supported (2, 4 and 8 are)")


def _work(t, float_dtype):
    return float_dtype or torch.promote_types(t.dtype, torch.float32)


def _zero_points(op, zero_points, bits, rows, blocks, work, device):
    """Per-block zero points (rows, blocks): the default 2^(bits-1), packed uint8, or float (unpacked)."""
    if zero_points is None:
        return torch.full((), float(1 << (bits - 1)), dtype=work, device=device)
    if zero_points.dtype == torch.uint8:
        values = unpack_bits(zero_points.reshape(rows, -1), bits)
        if values.shape[1] < blocks:
            raise OnnxGradError(f"{op}: packed zero_points of shape {list(zero_points.shape)} hold fewer than "
                                f"{rows}×{blocks} values")
        return values[:, :blocks].to(work)
    if zero_points.is_floating_point():
        if zero_points.numel() != rows * blocks:
            raise OnnxGradError(f"{op}: float zero_points must hold {rows}×{blocks} values, got {list(zero_points.shape)}")
        return zero_points.reshape(rows, blocks).to(work)
    raise OnnxGradError(f"{op}: zero_points of type {zero_points.dtype} are not supported (uint8 or float)")


@describe("MatMulNBits", domain=MS, needs="in",
          rule=("dA = dY · Wᵀ   # W = (unpack(B) − zero) · scale, the dequantized weights",
                None,
                "dscales = Σ over each block of (dYᵀ · A) ⊙ (q − zero)",
                "dzero_points = −Σ over each block of (dYᵀ · A) · scale   # float zero points; packed ones are integers",
                None,
                "dbias = Σ dY over the leading axes"))
@register("MatMulNBits", domain=MS, since=1)
def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, block_size, bits=4, accuracy_level=0,
                 weight_prepacked=0, float_dtype=None):
    op = "MatMulNBits"
    _check_bits(op, bits)
    if weight_prepacked:
        raise UnsupportedOpError(f"{op}: weight_prepacked=1 (an execution provider's private layout) is not supported")
    if block_size < 16 or block_size & (block_size - 1):
        raise OnnxGradError(f"{op}: block_size must be a power of two >= 16, got {block_size}")
    if a.shape[-1] != K:
        raise OnnxGradError(f"{op}: A's last axis is {a.shape[-1]}, attribute K is {K}")
    blocks = -(-K // block_size)
    if b.dtype != torch.uint8 or b.numel() != N * blocks * block_size * bits // 8:
        raise OnnxGradError(f"{op}: B must be uint8 of shape ({N}, {blocks}, {block_size * bits // 8}), got "
                            f"{b.dtype} {list(b.shape)}")
    if scales.numel() != N * blocks:
        raise OnnxGradError(f"{op}: scales must hold {N}×{blocks} values, got shape {list(scales.shape)}")
    work = _work(a, float_dtype)
    q = unpack_bits(b.reshape(N, -1), bits)[:, :K].to(work)  # (N, K)
    zp = _zero_points(op, zero_points, bits, N, blocks, work, a.device)
    sc = scales.reshape(N, blocks).to(work)
    if g_idx is not None and bits != 4:
        raise UnsupportedOpError(f"{op}: g_idx with {bits}-bit weights is not supported (4 bits are; onnxruntime's "
                                 "CPU kernel refuses 8 bits and misreads 2 bits)")
    # NOTE: g_idx (deprecated, act-order) says which block each input feature's scale and zero point come from.
    group = (torch.arange(K, device=a.device) // block_size if g_idx is None else g_idx.long().reshape(-1))
    if group.numel() != K or int(group.max()) >= blocks or int(group.min()) < 0:
        raise OnnxGradError(f"{op}: g_idx must hold {K} block indices below {blocks}")
    if g_idx is not None and zero_points is not None and zero_points.dtype == torch.uint8:
        # NOTE: onnxruntime's CPU kernel (1.32) does not apply uint8 zero points when g_idx is given: every
        # block uses the default 2^(bits-1). The kernel wins over the schema text here.
        zp = torch.full((), float(1 << (bits - 1)), dtype=work, device=a.device)
    zp_k = zp if zp.dim() == 0 else zp[:, group]
    weight = (q - zp_k) * sc[:, group]  # (N, K)
    y = torch.matmul(a.to(work), weight.transpose(0, 1))
    if bias is not None:
        y = y + bias.to(work)
    return y.to(a.dtype)


@describe("GatherBlockQuantized", domain=MS, needs="in",
          rule=(None,
                None,
                "dscales = scatter-add of dY ⊙ (q − zero) into each gathered row's blocks",
                None))
@register("GatherBlockQuantized", domain=MS, since=1)
def gather_block_quantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128, gather_axis=0,
                           quantize_axis=1, float_dtype=None):
    op = "GatherBlockQuantized"
    _check_bits(op, bits)
    if data.dtype != torch.uint8:
        raise UnsupportedOpError(f"{op}: data of type {data.dtype} is not supported (uint8-packed data is; "
                                 "int4, uint4, float8 and float4 tensors are not)")
    rank = data.dim()
    if gather_axis % rank != 0 or quantize_axis % rank != rank - 1:
        raise OnnxGradError(f"{op}: for uint8 data gather_axis must be 0 and quantize_axis the last axis, as in "
                            f"onnxruntime's kernel (got {gather_axis} and {quantize_axis})")
    if block_size < 16 or block_size & (block_size - 1):
        raise OnnxGradError(f"{op}: block_size must be a power of two >= 16, got {block_size}")
    values = unpack_bits(data, bits)  # (..., C)
    cols = values.shape[-1]
    blocks = -(-cols // block_size)
    if scales.dim() != rank or scales.shape[-1] != blocks or any(
            s not in (1, d) for s, d in zip(scales.shape[:-1], values.shape[:-1])):
        raise OnnxGradError(f"{op}: scales of shape {list(scales.shape)} do not match data {list(values.shape)} "
                            f"with block_size {block_size}")
    work = _work(scales, float_dtype)
    if zero_points is None:
        zp = torch.full((), float(1 << (bits - 1)), dtype=work, device=data.device)
    else:
        zp = unpack_bits(zero_points, bits)[..., :blocks].to(work)
        if zp.shape != scales.shape:
            raise OnnxGradError(f"{op}: zero_points of shape {list(zero_points.shape)} do not match the scales")
        zp = zp.repeat_interleave(block_size, -1)[..., :cols]
    sc = scales.to(work).repeat_interleave(block_size, -1)[..., :cols]
    table = (values.to(work) - zp) * sc
    rows = table.shape[0]
    idx = indices.long()
    idx = torch.where(idx < 0, idx + rows, idx)
    # NOTE: unlike ONNX Gather, an index outside [-rows, rows) gives a row of zeros (the kernel's rule).
    inside = (idx >= 0) & (idx < rows)
    picked = table[torch.where(inside, idx, torch.zeros_like(idx))]
    keep = inside.reshape(*inside.shape, *([1] * (rank - 1)))
    return torch.where(keep, picked, torch.zeros_like(picked)).to(scales.dtype)


def _per_column(op, name, t, columns, work):
    """A scalar or per-column (N) scale / zero point, broadcastable over the last axis."""
    if t.numel() == 1:
        return t.reshape(()).to(work)
    if t.dim() == 1 and t.shape[0] == columns:
        return t.to(work)
    raise OnnxGradError(f"{op}: {name} must be a scalar or have {columns} elements, got shape {list(t.shape)}")


def _dynamic_uint8(x):
    """DynamicQuantizeLinear's uint8 quantization of x, dequantized: the values the kernel multiplies."""
    xf = x.detach().to(torch.float32)
    high, low = torch.clamp(xf.max(), min=0.0), torch.clamp(xf.min(), max=0.0)
    scale = torch.where(high == low, torch.ones_like(high), high - low) / 255.0
    zero = torch.round(torch.clamp(-low / scale, 0.0, 255.0))
    q = torch.clamp(torch.round(xf / scale) + zero, 0, 255)
    return (q - zero) * scale


@describe("DynamicQuantizeMatMul", domain=MS, needs="in",
          rule=("dA = dY · dequant(B)ᵀ   # straight-through: A's on-the-fly uint8 rounding counts as identity",
                None,
                "db_scale = Σ (Âᵀ · dY) ⊙ (B − zero) per column   # Â: A after its uint8 round trip",
                None,
                "dbias = Σ dY over the leading axes"))
@register("DynamicQuantizeMatMul", domain=MS, since=1)
def dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None, *, float_dtype=None):
    op = "DynamicQuantizeMatMul"
    if b.is_floating_point():
        raise OnnxGradError(f"{op}: B must be int8 or uint8, got {b.dtype}")
    work = _work(a, float_dtype)
    cols = b.shape[-1]
    centered = b.to(work) if b_zero_point is None else b.to(work) - _per_column(op, "b_zero_point", b_zero_point,
                                                                                 cols, work)
    weight = centered * _per_column(op, "b_scale", b_scale, cols, work)
    a_work = a.to(work)
    # NOTE: A is quantized to uint8 on the fly; that staircase has derivative 0 almost everywhere, so the
    # backward is straight-through: dA is the gradient of A · dequant(B), as quantization-aware training uses.
    a_used = a_work + (_dynamic_uint8(a).to(work) - a_work).detach()
    y = torch.matmul(a_used, weight)
    if bias is not None:
        y = y + bias.to(work)
    return y.to(a.dtype)


@describe("MatMulIntegerToFloat", domain=MS, needs="in",
          rule=(None,
                None,
                "da_scale = Σ dY ⊙ ((A − a_zero) · (B − b_zero)) · b_scale",
                "db_scale = Σ dY ⊙ ((A − a_zero) · (B − b_zero)) · a_scale per column",
                None,
                None,
                "dbias = Σ dY over the leading axes"))
@register("MatMulIntegerToFloat", domain=MS, since=1)
def matmul_integer_to_float(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *,
                            float_dtype=None):
    op = "MatMulIntegerToFloat"
    if a.is_floating_point() or b.is_floating_point():
        raise OnnxGradError(f"{op}: A and B must be 8-bit integers, got {a.dtype} and {b.dtype}")
    if a_scale.numel() != 1 or (a_zero_point is not None and a_zero_point.numel() != 1):
        raise UnsupportedOpError(f"{op}: a per-channel a_scale or a_zero_point is not supported (the kernel takes "
                                 "a scalar)")
    work = _work(a_scale, float_dtype)
    cols = b.shape[-1]
    a_c = a.to(torch.float64) - (0 if a_zero_point is None else a_zero_point.to(torch.float64).reshape(()))
    b_c = b.to(torch.float64) - (0 if b_zero_point is None else _per_column(op, "b_zero_point", b_zero_point, cols,
                                                                            torch.float64))
    acc = torch.matmul(a_c, b_c).to(work)  # exact: integer sums well inside float64's 53 bits
    y = acc * (a_scale.reshape(()).to(work) * _per_column(op, "b_scale", b_scale, cols, work))
    if bias is not None:
        y = y + bias.to(work)
    return y.to(a_scale.dtype)
