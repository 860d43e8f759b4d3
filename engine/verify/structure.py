"""Independent rows: when row r of x feeds row r of y only, one perturbed forward serves every row.

A batch of B images through a CNN, or the rows of a 4x32 input through a MatMul chain, never mix:
perturbing element j of every row at once and reading <dy, y> row by row gives B central
differences for the price of one (Curtis-Powell-Reid compression with the batch axis as colours).
Whether rows mix is measured, not assumed: each row is moved by a large random step in its own
probe forward and every other row of y must stay put to 1e-12. A mixing op (BatchNorm in training
mode, Softmax or a reduction over axis 0, CumSum along it, ...) moves other rows and turns it off.
"""
from __future__ import annotations

import numpy as np
import torch

from .batching import BatchEvaluator
from .fd import normal

MAX_ROWS = 4096


def independent_rows(evaluator: BatchEvaluator, x: torch.Tensor, y0: torch.Tensor, seed: int,
                     max_batch: int = MAX_ROWS) -> int:
    """B when the B rows (axis 0) of x act on the B rows of y independently, else 1."""
    if x.dim() == 0 or y0.dim() == 0 or x.shape[0] < 2 or y0.shape[0] != x.shape[0] \
            or x.shape[0] > min(MAX_ROWS, max_batch):
        return 1
    if x.numel() == x.shape[0]:  # one element per row: nothing to share
        return 1
    if not bool(torch.isfinite(y0).all()):
        return 1
    b = x.shape[0]
    noise = normal(x.shape, seed, x).to(x.dtype)
    step = 0.1 * (1.0 + x.abs()) * noise
    probes = x.detach().unsqueeze(0).repeat((b,) + (1,) * x.dim())
    idx = torch.arange(b, device=x.device)
    probes[idx, idx] += step
    with torch.no_grad():
        out = evaluator(probes, verify=False)  # [B, *y.shape]; compared with y0 below anyway
    if out.shape != (b,) + tuple(y0.shape):
        return 1
    out, base = out.detach().cpu().numpy(), y0.detach().cpu().numpy()
    if not np.isfinite(out).all():
        return 1
    moved = np.abs(out - base[None]) > 1e-12 * (np.abs(base)[None] + np.abs(base).max())
    moved = moved.reshape(b, b, -1).any(-1)  # [probe r, row s]
    np.fill_diagonal(moved, False)
    return 1 if bool(moved.any()) else b
