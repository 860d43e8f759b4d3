"""Products with a big constant cast one block of its columns at a time (`cast_in_blocks`).

A MatMul or Gemm whose weight is cast where it is read (cast_at_use.py) would hold the whole cast copy
while it multiplies: GPT-2's lm_head weight, 768 x 50257 float32, is 0.31 GB as float64 for the length
of one product. Cut into blocks of columns, the product is the same columns side by side, and only one
block is ever cast. It is written in plain ops (slices, the op itself, cat), so autograd, forward-mode
AD (dual tensors), vmap and double backward see ordinary ops. Under the saved-tensor hooks of
`keeping_sources` each block's saved cast is packed as its float32 slice, so the backward casts one
block at a time too."""
from __future__ import annotations

import torch

from . import cast_at_use

# The bytes of one cast block. A constant whose cast is at most this is cast whole, as before.
BLOCK_BYTES = 32 << 20
PRODUCTS = frozenset({"MatMul", "Gemm"})  # ops whose output's last axis runs over B's columns


def blocked(step) -> bool:
    """A product step that reads a cast B: it casts B itself, in blocks."""
    return step.op_type in PRODUCTS and 1 in step.cast


def cast_in_blocks(fn, dtype: torch.dtype):
    """`fn(a, b, c=None, **kwargs)` (the step's own op) over B's column blocks, each cast to `dtype`."""
    def step(a, b, *rest, **kwargs):
        columns = _columns(b, kwargs)
        width = 0 if columns is None else max(1, BLOCK_BYTES // (b.numel() // columns * dtype.itemsize))
        if columns is None or width >= columns or b.dtype == dtype:
            return fn(a, cast_at_use.cast_one(b, dtype), *rest, **kwargs)
        c = rest[0] if rest else None
        pieces = []
        for j in range(0, columns, width):
            block = b[j:j + width] if kwargs.get("transB") else b[:, j:j + width]
            more = (_c_columns(c, columns, j, width),) if rest else ()
            pieces.append(fn(a, cast_at_use.cast_one(block, dtype), *more, **kwargs))
        return torch.cat(pieces, -1)

    step.no_fold = True  # folded, the whole cast product's weight would be evaluated ahead, whole
    step.cast_in_blocks = True  # the memory guard counts one cast block (at most BLOCK_BYTES) while it runs
    step.__name__ = f"blocked_{getattr(fn, '__name__', 'product')}"
    return step


def _columns(b, kwargs) -> int | None:
    """How many columns of the output B gives, or None where blocks do not apply (B not 2-D)."""
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        return None
    return b.shape[0] if kwargs.get("transB") else b.shape[1]


def _c_columns(c, columns: int, start: int, width: int):
    """Gemm's C for the output columns [start, start + width): sliced where it runs over them."""
    if c is None or c.dim() == 0 or c.shape[-1] != columns:
        return c
    return c[..., start:start + width]
