"""What a check needs from the forward at its point without keeping that forward's values.

A check used to hold every float64 value of one forward for its whole run (GPT-2 124M at 32 tokens:
0.21 GB, a third of the model's bytes) only to read their sizes, the magnitudes downstream of each x
and the few values an x's frontier feeds. One observed forward gives the sizes and magnitudes as
numbers; the frontier's values come from a forward that keeps just them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..run.plan import Plan, StepObserver
from .absorbed import largest


@dataclass(frozen=True)
class ForwardStats:
    """`bytes`: every value one forward holds, constants included (as the run's keep-all dict
    counted them); `largest`: the largest finite |value| of each floating-point value computed or fed."""

    bytes: int
    largest: dict[str, float]


class _Tally(StepObserver):
    def __init__(self):
        self.bytes = 0
        self.largest: dict[str, float] = {}

    def _see(self, name, value) -> None:
        if name is None or not isinstance(value, torch.Tensor):
            return
        self.bytes += value.numel() * value.element_size()
        if value.is_floating_point():
            self.largest[name] = largest(value)

    def source(self, name, value):
        self._see(name, value)
        return value

    def outputs(self, step, args, names, outs):
        for name, value in zip(names, outs):
            self._see(name, value)
        return outs


def forward_stats(plan: Plan, inputs: Sequence[torch.Tensor]) -> ForwardStats:
    """Sizes and magnitudes of one forward of `plan` (built without keep_all), each value dropped
    after its last reader."""
    tally = _Tally()
    with torch.no_grad():
        plan.run_observed(list(inputs), tally, free=True)
    constants = sum(v.numel() * v.element_size() for v in plan.constants().values() if isinstance(v, torch.Tensor))
    return ForwardStats(tally.bytes + constants, tally.largest)
