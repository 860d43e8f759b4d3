"""One direction v, element by element: an analytic tangent (J·v, or H·v when f is a gradient)
against float64 central differences of f along v, read at every element of f(x).

One perturbation vector moves x along v, and the objective reads each element of f as a row of its
own (dy = ones, one element a row), so every item is (f(x + hv) - f(x - hv))_i / 2h: a single pair
of forwards, plus a pair at a tiny step that measures each element's roundoff and a pair at h/2 for
Richardson when the first pass does not settle every item. The items are judged by verdict.py's
element rules, the tangent's largest element as the scale, exactly as a gradient's elements are.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch

from . import fd, verdict
from .batching import BatchEvaluator
from .report import XCheck
from .xcheck import Options, XProbe

KIND = "tangent"


def along(x: torch.Tensor, v: torch.Tensor, rows: int, step: float = fd.STEP) -> fd.Perturbations:
    """The one vector v as a perturbation set read on `rows` rows; the step is relative to x's RMS."""
    rms = float(torch.linalg.vector_norm(x.detach())) / x.numel() ** 0.5 if x.numel() else 0.0
    t = step * max(1.0, rms)

    def build(ids: torch.Tensor, scale) -> torch.Tensor:
        moved = v.unsqueeze(0).expand((len(ids),) + tuple(v.shape))
        if isinstance(scale, float):
            return (t * scale) * moved
        return (t * scale.to(v)).reshape((len(ids),) + (1,) * v.dim()) * moved

    return fd.Perturbations(KIND, 1, rows, np.full((1, rows), t), build)


class TangentProbe(XProbe):
    """Central differences of `fn` along `v` at x, one item per element of fn(x) (= `f0`).

    It reports through XProbe.result, so its XCheck reads as any other: items are elements of f(x)
    (`shape` and `total` are f's, `worst_index` an element of f), `kind` is "tangent"."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, f0: torch.Tensor,
                 v: torch.Tensor, opts: Options, control: fd.Control, stage: str, state: dict | None = None):
        self.name, self.x, self.opts, self.control, self.stage = name, x, opts, control, stage
        self.f0 = f0
        self._done_before = control.done
        self.evaluator = BatchEvaluator(fn, shape=f0.shape, state=state)
        self.rows = max(1, f0.numel())
        ones = torch.ones_like(f0)
        self.objective = fd.Objective(self.evaluator, f0, ones, self.rows)
        self.pert = along(x, v.to(x), self.rows)
        self.order = torch.arange(1)
        self.verdicts: verdict.Verdicts | None = None
        control.plan(4)
        self.m = fd.measure(self.objective, x, self.pert, self.order, opts.chunk, control, stage, probes=1)

    def judge(self, tangent: torch.Tensor, roundoff: torch.Tensor | None = None) -> verdict.Verdicts:
        """Verdicts for `tangent` (shaped like f(x)): a clear pass from the first pass, else every item
        refined at h/2 (one more pair of forwards) and classified."""
        a = tangent.detach().to(torch.float64).reshape(-1).cpu().numpy()
        self.analytic = a
        m = self.m

        def tolerance() -> verdict.Tolerance:
            scale = verdict.element_scale(a[m.evaluated], m.d1[m.evaluated])
            return verdict.tolerance(len(a), self.opts.rtol, self.opts.atol, scale, m.noise)

        v = verdict.all_clear(a, m, tolerance())
        if v is None:
            fd.refine(self.objective, self.x, self.pert, m, np.arange(self.pert.items), self.opts.chunk,
                      self.control, self.stage)
            v = verdict.classify(a, m, tolerance())
        self.verdicts = v
        return v

    def item_index(self, item: int) -> tuple[tuple[int, ...] | None, int | None]:
        if self.f0.dim() == 0:
            return (), None
        return tuple(int(i) for i in np.unravel_index(int(item), tuple(self.f0.shape))), None

    def result(self, v: verdict.Verdicts, **extra) -> XCheck:
        r = super().result(v, **extra)
        return dataclasses.replace(r, shape=tuple(self.f0.shape), total=int(self.f0.numel()), kind=KIND, rows=1)
