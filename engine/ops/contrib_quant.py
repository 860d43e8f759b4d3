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
from ..registry import describe, register, validates
from .inputs import bad_attribute

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


def _block_size(block_size):
    if block_size < 16 or block_size & (block_size - 1):
        bad_attribute("block_size", block_size, "a power of two >= 16")


def _holds(ins, name, count, what):
    t = ins[name]
    if t is not None and t.numel() != count:
        ins.fail(name, f"holds {t.numel()} values, expected {count} ({what})")


@validates("MatMulNBits", domain=MS)
def _matmul_nbits_inputs(ins, *, K, N, block_size, bits=4, **_):
    """onnxruntime's MatMulNBits checks: A's last dim is K; B, scales, zero points hold N × blocks of K."""
    _block_size(block_size)
    ins.dim("A", -1, K, "attribute K")
    blocks = -(-K // block_size)
    ins.dtype("B", torch.uint8)
    blob = block_size * bits // 8
    _holds(ins, "B", N * blocks * blob, f"N {N} × {blocks} blocks × {blob} bytes: block_size {block_size} of {bits} bits")
    _holds(ins, "scales", N * blocks, f"N {N} × {blocks} blocks of K {K} by {block_size}")
    zp = ins["zero_points"]
    if zp is not None and zp.dtype == torch.uint8:
        packed = -(-blocks * bits // 8)
        if zp.numel() < N * packed:
            ins.fail("zero_points", f"holds {zp.numel()} values, expected {N * packed} (N {N} × {blocks} blocks "
                                    f"packed {8 // bits} per byte)")
    elif zp is not None:
        _holds(ins, "zero_points", N * blocks, f"N {N} × {blocks} blocks")
    _holds(ins, "g_idx", K, f"one block index per row of K {K}")
    ins.width("bias", N, "attribute N")


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
    blocks = -(-K // block_size)
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


@validates("GatherBlockQuantized", domain=MS)
def _gather_block_quantized_inputs(ins, *, bits=4, block_size=128, gather_axis=0, quantize_axis=1, **_):
    """onnxruntime's checks for uint8 data: rows gathered on axis 0, blocks along the packed last axis."""
    _block_size(block_size)
    data = ins.shape("data")
    rank = len(data)
    if ins["data"].dtype == torch.uint8 and gather_axis % rank != 0:
        bad_attribute("gather_axis", gather_axis, "0 for uint8 data (onnxruntime's kernel)")
    if ins["data"].dtype == torch.uint8 and quantize_axis % rank != rank - 1:
        bad_attribute("quantize_axis", quantize_axis, f"the last axis, {rank - 1}, for uint8 data")
    if bits not in (2, 4, 8) or ins["data"].dtype != torch.uint8:
        return  # the forward refuses these bit widths and data types
    blocks = -(-data[-1] * (8 // bits) // block_size)
    ins.rank("scales", rank, layout=f"data's {rank} dims, blocks last")
    ins.dim("scales", -1, blocks, f"data's {data[-1] * 8 // bits} {bits}-bit columns in blocks of block_size {block_size}")
    ins.broadcasts("scales", data[:-1] + (blocks,), "data's leading dims")
    zp = ins.shape("zero_points")
    if zp is not None and (zp[:-1] != ins.shape("scales")[:-1] or zp[-1] * (8 // bits) < blocks):
        ins.fail("zero_points", f"expected {ins.shape('scales')[:-1] + (-(-blocks * bits // 8),)} "
                                f"(the scales' {blocks} blocks packed {8 // bits} per byte)")


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
    values = unpack_bits(data, bits)  # (..., C)
    cols = values.shape[-1]
    blocks = -(-cols // block_size)
    work = _work(scales, float_dtype)
    if zero_points is None:
        zp = torch.full((), float(1 << (bits - 1)), dtype=work, device=data.device)
    else:
        zp = unpack_bits(zero_points, bits)[..., :blocks].to(work)
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


def _integer_matmul_inputs(ins, scales: tuple[str, ...], zero_points: tuple[str, ...]):
    """A (…, K) times B (K, N): B's scale and zero point per tensor or per column, the bias per column."""
    a = ins.shape("A")
    _, n = ins.rank("B", 2, layout="K, N")
    ins.dim("B", 0, a[-1], "K, A's last dim")
    for name in scales + zero_points:
        shape = ins.shape(name)
        if shape is not None and ins[name].numel() != 1 and shape != (n,):
            ins.fail(name, f"expected a scalar or [{n}] (one per column of B)")
    ins.width("bias", n, "N, B's dim 1")


def _dynamic_uint8(x):
    """DynamicQuantizeLinear's uint8 quantization of x, dequantized: the values the kernel multiplies."""
    xf = x.detach().to(torch.float32)
    high, low = torch.clamp(xf.max(), min=0.0), torch.clamp(xf.min(), max=0.0)
    scale = torch.where(high == low, torch.ones_like(high), high - low) / 255.0
    zero = torch.round(torch.clamp(-low / scale, 0.0, 255.0))
    q = torch.clamp(torch.round(xf / scale) + zero, 0, 255)
    return (q - zero) * scale


@validates("DynamicQuantizeMatMul", domain=MS)
def _dynamic_quantize_matmul_inputs(ins, **_):
    _integer_matmul_inputs(ins, ("b_scale",), ("b_zero_point",))


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


@validates("MatMulIntegerToFloat", domain=MS)
def _matmul_integer_to_float_inputs(ins, **_):
    _integer_matmul_inputs(ins, ("b_scale",), ("b_zero_point",))


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
