"""Evaluate a function of one tensor on a whole batch of values of that tensor, as fast as is safe.

Three strategies, tried in order and verified once against plain single calls:
- native: pass the stacked batch straight in. Many graphs (MatMul chains, elementwise math) are
  polymorphic in a new leading axis and this is the fastest, but an op with a positive axis
  attribute would silently mix entries, so the result must have shape (K, *y.shape) and its
  first and last entries must equal single calls;
- vmap: torch.func.vmap over the leading axis (every op that vmaps);
- loop: one call per entry (anything).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

STRATEGIES = ("native", "vmap", "loop")


class BatchEvaluator:
    """`fn(x) -> tensor`; `evaluator(xb)` returns the stacked outputs for xb[0], xb[1], ..."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], allow=STRATEGIES):
        self.fn = fn
        self._candidates = [s for s in STRATEGIES if s in allow]
        self.strategy: str | None = None
        self._verified: set[int] = set()

    def __call__(self, xb: torch.Tensor) -> torch.Tensor:
        k = xb.shape[0]
        while True:
            strategy = self.strategy or self._candidates[0]
            if strategy == "loop":
                self.strategy = "loop"
                return torch.stack([self.fn(xb[i]) for i in range(k)])
            out = self._try(strategy, xb)
            if out is not None:
                self.strategy = strategy
                return out
            self._candidates.remove(strategy)
            self.strategy = None
            self._verified.clear()

    def _try(self, strategy: str, xb: torch.Tensor) -> torch.Tensor | None:
        k = xb.shape[0]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # vmap's "no batching rule, falling back" notes
                out = self.fn(xb) if strategy == "native" else torch.func.vmap(self.fn)(xb)
        except Exception:  # an op that does not batch this way: the loop will surface real errors
            return None
        if not isinstance(out, torch.Tensor) or out.shape[:1] != (k,):
            return None
        if k in self._verified:
            return out
        singles = [self.fn(xb[0])] + ([self.fn(xb[k - 1])] if k > 1 else [])
        for got, want in zip((out[0], out[k - 1]), singles):
            if got.shape != want.shape or not _same(got, want):
                return None
        self._verified.add(k)
        return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    scale = float(b.abs().max()) if b.numel() else 0.0
    both_nan = torch.isnan(a) & torch.isnan(b)
    close = (a - b).abs() <= 1e-10 * (b.abs() + scale) + 1e-300
    return bool((close | both_nan | (a == b)).all())
