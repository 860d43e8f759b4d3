"""B's side of the forward comparison, measured as B computes each value: every value B computes (or
reads) that stands for one of A's tensors is compared with A's right then, so a run of B need not
keep its values (compare.py streams B's runs; A's values are the only ones held throughout)."""
from __future__ import annotations

import torch

from .tolerance import TINY, all_finite, eps_of_dtypes, eps_of_values, relative_error, tolerance


class Measured:
    """Errors of A's tensors against one run of B (in A's names), and what the rows need to know of
    B's values after they are gone: their dtypes and whether they stayed finite (in B's names).

    errors: relative error at the default floor, unsaturated (inputs, weights); unit_errors: for the
    outputs of a compared unit, (error, error with half-type saturation) at the unit's floor."""

    def __init__(self, values_a, of_b: dict[str, list[str]], floors: dict[str, float], keep_values: bool = False):
        self.values_a, self.of_b, self.floors, self.keep_values = values_a, of_b, floors, keep_values
        self.errors: dict[str, float] = {}
        self.unit_errors: dict[str, tuple[float, float]] = {}
        self.same_shape: dict[str, bool] = {}
        self.finite: dict[str, bool] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.kept: dict[str, object] = {}  # A's name -> B's value as numpy (keep_values)

    def __call__(self, name: str, value: torch.Tensor) -> None:
        self.dtypes[name] = value.dtype
        finite = all_finite(value)
        self.finite[name] = finite
        for a in self.of_b.get(name, ()):
            va = self.values_a.get(a)
            if not isinstance(va, torch.Tensor):
                continue
            self.same_shape[a] = va.shape == value.shape
            error = relative_error(va, value)
            self.errors[a] = error
            floor = self.floors.get(a)
            if floor is None:
                continue
            at_floor = error if floor == TINY else relative_error(va, value, False, floor)
            self.unit_errors[a] = (at_floor, at_floor if finite else relative_error(va, value, True, floor))
            if self.keep_values:
                self.kept[a] = as_numpy(value)

    def beyond_rounding(self, a: str, b: str | None) -> bool:
        """A's tensor `a` and B's `b` (same shape) part by more than rounding to the lower precision: a
        weight B changed, where the forward says so at its consumer and the gradient leaves it out."""
        return self.errors[a] > tolerance(max(eps_of_values(self.values_a.get(a)), eps_of_dtypes(self.dtypes.get(b))))

    def measure_all(self, values: dict) -> "Measured":
        """The same from values already computed (onnxruntime's side)."""
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                self(name, value)
        return self


def b_names_of(matching) -> dict[str, list[str]]:
    """B's tensor -> the A tensors it stands for (a B tensor may stand for several: a merged Reshape)."""
    of_b: dict[str, list[str]] = {}
    for a, b in matching.tensors.items():
        of_b.setdefault(b, []).append(a)
    return of_b


def as_numpy(value):
    """A value as numpy in its own dtype (bfloat16 as float32), None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    from ..dtypes import to_numpy

    return to_numpy(value)
