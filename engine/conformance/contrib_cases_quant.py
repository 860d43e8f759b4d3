"""Generated cases of the weight-quantized contrib ops (MatMulNBits, GatherBlockQuantized,
DynamicQuantizeMatMul, MatMulIntegerToFloat). Integer weights come packed the way onnxruntime's
quantizers write them; int8 weights stay within ±63 (the quantizer's reduce_range), since
onnxruntime's u8s8 kernel on AVX2 saturates int16 pair sums beyond it."""
from __future__ import annotations

import numpy as np

from .contrib_case import make, normal, rng_for


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Integer values (…, n) -> uint8 (…, n·bits/8), low bits first (what the kernels read)."""
    per = 8 // bits
    pad = (-values.shape[-1]) % per
    if pad:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], pad), values.dtype)], -1)
    grouped = values.reshape(*values.shape[:-1], -1, per).astype(np.uint8)
    out = np.zeros(grouped.shape[:-1], np.uint8)
    for i in range(per):
        out |= (grouped[..., i] << (bits * i)).astype(np.uint8)
    return out


def _scales(rng, *shape):
    return (rng.uniform(0.02, 0.2, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def _matmul_nbits():
    rng = rng_for("MatMulNBits")
    out = []
    configs = []
    for k in range(24):
        bits = (4, 8, 2)[k % 3]
        zp = ("none", "packed", "float")[(k // 3) % 3] if bits != 8 else ("none", "packed")[(k // 3) % 2]
        configs.append((bits, zp, (32, 40, 64, 16)[k % 4], (16, 32)[(k // 4) % 2], k))
    for bits, zp, big_k, block, k in configs:
        n = (5, 3, 8)[k % 3]
        blocks = -(-big_k // block)
        q = rng.integers(0, 1 << bits, (n, blocks * block))
        a_shape = [(3, big_k), (2, 3, big_k), (big_k,), (1, 4, big_k)][k % 4]
        values = {"A": normal(rng, *a_shape), "B": pack_bits(q, bits).reshape(n, blocks, -1),
                  "scales": _scales(rng, n * blocks) if k % 5 == 0 else _scales(rng, n, blocks)}
        if zp == "packed":
            values["zero_points"] = pack_bits(rng.integers(0, 1 << bits, (n, blocks)), bits)
        elif zp == "float":
            values["zero_points"] = normal(rng, n, blocks, scale=2.0, shift=float(1 << (bits - 1)))
        if k % 6 == 3 and bits == 4 and zp != "float":  # act-order groups
            values["g_idx"] = rng.integers(0, blocks, big_k).astype(np.int32)
        if k % 2 == 1:
            values["bias"] = normal(rng, n)
        attrs = {"K": big_k, "N": n, "bits": bits, "block_size": block}
        if k % 6 == 4:
            attrs["accuracy_level"] = 4
        label = f"{bits}bit-K{big_k}-bs{block}-zp_{zp}-A{'x'.join(map(str, a_shape))}" + \
            "".join(f"-{x}" for x in ("g_idx", "bias") if x in values) + ("-acc4" if "accuracy_level" in attrs else "")
        out.append(make("MatMulNBits", label, values, attrs))
    return out


def _gather_block_quantized():
    rng = rng_for("GatherBlockQuantized")
    out = []
    index_sets = [np.array([0, 3, 1]), np.array([[2, 2], [0, 4]]), np.array(1), np.array([-1, -5, 2]),
                  np.array([0, 9, -9, 4])]  # the last: out of range gives zero rows
    for k in range(20):
        bits, block = (4, 8, 2)[k % 3], (16, 32)[(k // 3) % 2]
        cols = (32, 64, 48)[k % 3]
        lead = (5,)  # onnxruntime's kernel takes 2-D uint8 tables only, with one scale row per table row
        values_int = rng.integers(0, 1 << bits, (*lead, cols))
        blocks = -(-cols // block)
        scale_shape = (*lead, blocks)
        values = {"data": pack_bits(values_int, bits), "indices": index_sets[k % 5].astype((np.int64, np.int32)[k % 2]),
                  "scales": _scales(rng, *scale_shape)}
        if k % 2 == 0:
            values["zero_points"] = pack_bits(rng.integers(0, 1 << bits, scale_shape), bits)
        attrs = {"bits": bits, "block_size": block}
        if k % 6 == 1:
            attrs["quantize_axis"] = -1
        shape_text = "x".join(map(str, values["indices"].shape)) or "scalar"
        label = f"{bits}bit-bs{block}-data{'x'.join(map(str, (*lead, cols)))}-idx{shape_text}" \
            + f"-scales{'x'.join(map(str, scale_shape))}" + ("-zp" if "zero_points" in values else "") + \
            f"-{values['indices'].dtype}"
        out.append(make("GatherBlockQuantized", label, values, attrs))
    return out


def _int8(rng, shape, signed):
    return (rng.integers(-63, 64, shape).astype(np.int8) if signed else rng.integers(0, 256, shape).astype(np.uint8))


def _per_column(kind, n, draw):
    """A scalar, per-column (n) or one-element quantization parameter drawn by draw(shape)."""
    return draw({"scalar": (), "vector": (n,), "one": (1,)}[kind])


def _uniform(rng, low, high):
    return lambda shape: rng.uniform(low, high, shape).astype(np.float32)


def _integers(rng, low, high, dtype):
    return lambda shape: np.asarray(rng.integers(low, high, shape)).astype(dtype)


def _dynamic_quantize_matmul():
    rng = rng_for("DynamicQuantizeMatMul")
    out = []
    for k in range(20):
        signed, n, inner = k % 2 == 0, (5, 4, 7)[k % 3], (8, 6)[k % 2]
        a_shape = [(3, inner), (2, 3, inner), (1, 5, inner)][k % 3]
        scale_kind = ("scalar", "vector", "one")[(k // 2) % 3]
        values = {"A": normal(rng, *a_shape, shift=0.4 * (k % 3 - 1)), "B": _int8(rng, (inner, n), signed),
                  "b_scale": _per_column(scale_kind, n, _uniform(rng, 0.01, 0.1))}
        if k % 4 in (1, 2):
            values["b_zero_point"] = _per_column(scale_kind, n, _integers(rng, -5, 6, np.int8) if signed
                                                 else _integers(rng, 100, 156, np.uint8))
        if k % 3 != 2:
            values["bias"] = normal(rng, n)
        label = f"{'int8' if signed else 'uint8'}-A{'x'.join(map(str, a_shape))}-N{n}-scale_{scale_kind}" + \
            "".join(f"-{x}" for x in ("b_zero_point", "bias") if x in values)
        out.append(make("DynamicQuantizeMatMul", label, values, xs=[x for x in ("A", "b_scale", "bias") if x in values],
                        half=False, straight_through=("A",)))
    return out


def _matmul_integer_to_float():
    rng = rng_for("MatMulIntegerToFloat")
    out = []
    for k in range(20):
        signed, n, inner = k % 2 == 1, (5, 3, 6)[k % 3], (8, 4)[(k // 3) % 2]
        a_shape = [(3, inner), (2, 2, inner)][k % 2]
        scale_kind = ("scalar", "vector")[(k // 2) % 2]
        values = {"A": rng.integers(0, 256, a_shape).astype(np.uint8), "B": _int8(rng, (inner, n), signed),
                  "a_scale": rng.uniform(0.01, 0.05, (() if k % 3 else (1,))).astype(np.float32),
                  "b_scale": _per_column(scale_kind, n, _uniform(rng, 0.01, 0.1))}
        if k % 4 in (0, 3):
            values["a_zero_point"] = np.asarray(rng.integers(100, 156), np.uint8)
        if k % 4 in (1, 3):
            values["b_zero_point"] = _per_column(scale_kind, n, _integers(rng, -4, 5, np.int8) if signed
                                                 else _integers(rng, 120, 136, np.uint8))
        if k % 5 != 2:
            values["bias"] = normal(rng, n)
        label = f"{'int8' if signed else 'uint8'}B-A{'x'.join(map(str, a_shape))}-N{n}-bscale_{scale_kind}" + \
            "".join(f"-{x}" for x in ("a_zero_point", "b_zero_point", "bias") if x in values)
        out.append(make("MatMulIntegerToFloat", label, values))
    return out


def quant_cases():
    return _matmul_nbits() + _gather_block_quantized() + _dynamic_quantize_matmul() + _matmul_integer_to_float()
