"""Evaluate a function of one tensor on a whole batch of values of that tensor, as fast as is safe.

Three strategies, tried in order and verified once against plain single calls:
- native: pass the stacked batch straight in. Many graphs (MatMul chains, elementwise math) are
  polymorphic in a new leading axis and this is the fastest, but an op with a positive axis
  attribute would silently mix entries, so the result must have shape (K, *y.shape) and its
  last entry must equal a single call (checked once per batch size);
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

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], allow=STRATEGIES, shape=None,
                 state: dict | None = None):
        """`state`: a dict kept by the caller across evaluators of the same graph and x (a later
        check of the same model), holding what was learned: the strategy and the verified batch sizes."""
        self.fn = fn
        self._state = {} if state is None else state
        self._candidates = self._state.setdefault("candidates", [s for s in STRATEGIES if s in allow])
        self._verified: set[int] = self._state.setdefault("verified", set())
        # With the output's shape known, an entry whose output has another shape (Range's length
        # read from a float input: a step in the function) comes back as NaN and is flagged in
        # `changed` (one bool per entry of the last call) instead of breaking the stack.
        self.shape = None if shape is None else tuple(shape)
        self.changed: list[bool] | None = None

    @property
    def strategy(self) -> str | None:
        return self._state.get("strategy")

    @strategy.setter
    def strategy(self, value: str | None) -> None:
        self._state["strategy"] = value

    def __call__(self, xb: torch.Tensor, verify: bool = True) -> torch.Tensor:
        """`verify=False` skips the check against a single call, for callers that compare the
        entries with known values themselves (a mixing strategy then shows up as a mismatch)."""
        self.changed = None
        while True:
            strategy = self.strategy or self._candidates[0]
            if strategy == "loop":
                self.strategy = "loop"
                return self._loop(xb)
            out = self._try(strategy, xb, verify)
            if out is not None:
                self.strategy = strategy
                return out
            self._candidates.remove(strategy)
            self.strategy = None
            self._verified.clear()

    def _loop(self, xb: torch.Tensor) -> torch.Tensor:
        outs = [self.fn(xb[i]) for i in range(xb.shape[0])]
        if self.shape is None or all(tuple(o.shape) == self.shape for o in outs):
            return torch.stack(outs)
        self.changed = [tuple(o.shape) != self.shape for o in outs]
        like = next((o for o in outs if tuple(o.shape) == self.shape), None)
        if like is None:
            like = torch.empty(self.shape, dtype=outs[0].dtype, device=outs[0].device)
        nan = torch.full_like(like, float("nan")) if like.is_floating_point() else like
        return torch.stack([nan if c else o for o, c in zip(outs, self.changed)])

    def _try(self, strategy: str, xb: torch.Tensor, verify: bool = True) -> torch.Tensor | None:
        k = xb.shape[0]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # vmap's "no batching rule, falling back" notes
                out = self.fn(xb) if strategy == "native" else torch.func.vmap(self.fn)(xb)
        except Exception:  # an op that does not batch this way: the loop will surface real errors
            return None
        if not isinstance(out, torch.Tensor) or out.shape[:1] != (k,):
            return None
        if self.shape is not None and tuple(out.shape[1:]) != self.shape:
            # Value-dependent shapes (Unique, NonZero) batch into one common shape, or none: only the
            # loop can tell which entries changed shape.
            return None
        # vmap is exact by construction: one check per strategy suffices; native batching is only
        # right by luck of the graph, so it is checked at every batch size.
        if k in self._verified or not verify or (strategy == "vmap" and self._verified):
            return out
        # One entry per new batch size: a mixing op changes every entry, so one is enough to see it.
        want = self.fn(xb[k - 1])
        if out[k - 1].shape != want.shape or not _same(out[k - 1], want):
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
