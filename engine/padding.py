"""Padding geometry of ONNX's convolution and pooling ops, shared by the torch kernels (engine/ops)
and the ONNX backward rules (engine/lowering); plain Python, so lowering stays free of torch."""
from __future__ import annotations

from .errors import UnsupportedOpError

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def resolve_pads(op: str, auto_pad: str, in_sizes, kernel, strides, dilations, pads):
    """(pads_begin, pads_end) per spatial dim; SAME_* keeps ceil(in / stride) outputs."""
    nd = len(in_sizes)
    if auto_pad not in AUTO_PADS:
        raise UnsupportedOpError(f"{op}: auto_pad={auto_pad!r} is not supported (use one of {', '.join(AUTO_PADS)})")
    if auto_pad == "NOTSET":
        return pads[:nd], pads[nd:]
    if auto_pad == "VALID":
        return [0] * nd, [0] * nd
    begin, end = [], []
    for n, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return begin, end
