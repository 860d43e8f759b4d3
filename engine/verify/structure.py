"""Independent rows: when row r of x feeds row r of y only, one perturbed forward serves every row.

A batch of B images through a CNN, or the rows of a 4x32 input through a MatMul chain, never mix:
perturbing element j of every row at once and reading <dy, y> row by row gives B central
differences for the price of one (Curtis-Powell-Reid compression with the batch axis as colours).
Whether rows mix is measured, not assumed: each row is moved by a large random step in its own
probe forward and every other row of y must stay put to 1e-12. A mixing op (BatchNorm in training
mode, Softmax or a reduction over axis 0, CumSum along it, ...) moves other rows and turns it off.

A scalar loss mixes the rows only at the very end: the mean over the batch of per-row terms, or a
cross-entropy with reduction=mean. When y is an affine function of a value p that is still row by
row (the graph's trailing ReduceSum/ReduceMean/Mul/Div/Reshape/... chain, or a loss node read with
reduction=none), <dy, y(x)> = <w, p(x)> + c with w = d<dy, y>/dp, and L is read row by row from p.
The tail is found in the graph; both halves are measured at the same probes: the rows of p must
not mix, and <dy, y> must move exactly as <w, p> does (a wrong w, or a tail that is not affine
after all, turns sharing off and leaves the check as it was).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..run.plan import Plan, Step
from .batching import BatchEvaluator
from .fd import normal

MAX_ROWS = 4096
# Ops through which y is affine in the one input that depends on x (None: any input position).
AFFINE_TAIL: dict[str, tuple[int, ...] | None] = {
    "ReduceSum": (0,), "ReduceMean": (0,), "Sum": None, "Mean": None, "Add": None, "Sub": None, "Mul": None,
    "Div": (0,), "Neg": (0,), "Identity": (0,), "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
    "Flatten": (0,), "Transpose": (0,),
}
# Nodes that reduce to one number c * sum(terms), terms computed element by element from their first
# input: a loss's reduction=none output (None below), a square, an absolute value.
SEPARABLE: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "SoftmaxCrossEntropyLoss": None, "NegativeLogLikelihoodLoss": None,
    "ReduceSumSquare": torch.square, "ReduceL1": torch.abs,
}
SHAPE_OPS = ("Shape", "Size")  # their outputs do not move when x's values do
TAIL_RTOL = 1e-9  # <dy, y> against <w, p> at the probes, relative to the sum of |w * p|


@dataclass(frozen=True)
class Tail:
    """Where y stops being row by row: y is affine in `value`. With `reduction`, `value` is that
    node's output, one number, and the terms it adds up are read instead (see SEPARABLE)."""

    value: str
    reduction: Step | None = None


@dataclass(frozen=True)
class RowSplit:
    """<dy, y(x)> = <weights, fn(x)> + a constant, fn(x) shaped like p0."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    p0: torch.Tensor
    weights: torch.Tensor


def trailing_tail(plan: Plan, y: str, x: str) -> Tail | None:
    """The longest chain of affine ops ending at y, each with one input depending on x (a shape
    read from x does not count: it cannot move), walked back from y; None when y's own node is
    not one."""
    down, producer = {x}, {}
    for step in plan.steps:
        outs = [plan.names[s] for s in step.out_slots if s is not None]
        producer.update(dict.fromkeys(outs, step))
        if step.op_type not in SHAPE_OPS and down.intersection(plan.names[s] for s in step.in_slots if s is not None):
            down.update(outs)
    value = y
    while value in producer:
        step = producer[value]
        if plan.graph.nodes[step.node_index].domain not in ("", "ai.onnx"):
            break
        ins = [None if s is None else plan.names[s] for s in step.in_slots]
        moving = [k for k, n in enumerate(ins) if n in down]
        if len(moving) != 1:
            break
        (k,) = moving
        if step.op_type in SEPARABLE:
            first = step.out_slots[0] is not None and plan.names[step.out_slots[0]] == value
            if k == 0 and first and step.kwargs.get("reduction", "mean") in ("mean", "sum"):
                return Tail(value, step)
            break
        if step.op_type not in AFFINE_TAIL or (AFFINE_TAIL[step.op_type] is not None
                                               and k not in AFFINE_TAIL[step.op_type]):
            break
        value = ins[k]
    return None if value == y else Tail(value)


def separable_terms(step: Step, first_of: Callable[[torch.Tensor], torch.Tensor], others: list,
                    first0: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], float] | None:
    """(x -> the terms a SEPARABLE node adds up, d output / d term) for a node reducing to one number.

    A loss's mean divides by the total weight of the targets kept (ignore_index, class weights),
    which does not depend on x: the factor is the output over the sum of its terms at the point.
    """
    elementwise = SEPARABLE[step.op_type]
    per_row = {**step.kwargs, "reduction": "none"}

    def call(first: torch.Tensor, kwargs: dict) -> torch.Tensor:
        out = step.fn(first, *others, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    def terms(first: torch.Tensor) -> torch.Tensor:
        return call(first, per_row) if elementwise is None else elementwise(first)

    with torch.no_grad():
        reduced, parts = call(first0, step.kwargs), terms(first0)
    total = float(parts.sum())
    if reduced.numel() != 1 or total == 0 or not np.isfinite(total) or not bool(torch.isfinite(reduced).all()):
        return None
    return (lambda x: terms(first_of(x))), float(reduced.reshape(())) / total


def independent_rows(evaluator: BatchEvaluator, x: torch.Tensor, y0: torch.Tensor, seed: int,
                     max_batch: int = MAX_ROWS) -> int:
    """B when the B rows (axis 0) of x act on the B rows of y independently, else 1."""
    if not _candidate(x, y0, max_batch):
        return 1
    probes = _probes(x, seed)
    with torch.no_grad():
        out = evaluator(probes, verify=False)  # [B, *y.shape]; compared with y0 below anyway
    return x.shape[0] if _apart(out, y0) else 1


def rows_through_tail(split: RowSplit, evaluator: BatchEvaluator, full: BatchEvaluator, x: torch.Tensor,
                      y0: torch.Tensor, dy: torch.Tensor, seed: int, max_batch: int = MAX_ROWS) -> int:
    """B when the rows of x act on the rows of p = split.fn(x) independently and <dy, y> moves as
    <weights, p> does at the same probes (`evaluator` runs split.fn, `full` runs y), else 1."""
    p0, w = split.p0, split.weights
    if not _candidate(x, p0, max_batch) or tuple(w.shape) != tuple(p0.shape) or not bool(torch.isfinite(w).all()):
        return 1
    probes = _probes(x, seed)
    with torch.no_grad():
        out = evaluator(probes, verify=False)
        if not _apart(out, p0):
            return 1
        ys = full(probes, verify=False)
    if tuple(ys.shape) != (x.shape[0],) + tuple(y0.shape):
        return 1
    b = x.shape[0]
    moved = ((ys - y0) * dy).reshape(b, -1).sum(-1)
    predicted = ((out - p0) * w).reshape(b, -1).sum(-1)
    scale = (out * w).abs().reshape(b, -1).sum(-1) + float((p0 * w).abs().sum())
    if not bool(torch.isfinite(moved).all()) or bool(((moved - predicted).abs() > TAIL_RTOL * scale).any()):
        return 1
    return b


def _candidate(x: torch.Tensor, y0: torch.Tensor, max_batch: int) -> bool:
    if x.dim() == 0 or y0.dim() == 0 or x.shape[0] < 2 or y0.shape[0] != x.shape[0] \
            or x.shape[0] > min(MAX_ROWS, max_batch):
        return False
    if x.numel() == x.shape[0]:  # one element per row: nothing to share
        return False
    return bool(torch.isfinite(y0).all())


def _probes(x: torch.Tensor, seed: int) -> torch.Tensor:
    """B copies of x, copy r with row r moved by a large random step."""
    b = x.shape[0]
    noise = normal(x.shape, seed, x).to(x.dtype)
    step = 0.1 * (1.0 + x.abs()) * noise
    probes = x.detach().unsqueeze(0).repeat((b,) + (1,) * x.dim())
    idx = torch.arange(b, device=x.device)
    probes[idx, idx] += step
    return probes


def _apart(out: torch.Tensor, y0: torch.Tensor) -> bool:
    """Whether each probe moved its own row of y only."""
    b = out.shape[0]
    if out.shape != (b,) + tuple(y0.shape):
        return False
    out, base = out.detach().cpu().numpy(), y0.detach().cpu().numpy()
    if not np.isfinite(out).all():
        return False
    moved = np.abs(out - base[None]) > 1e-12 * (np.abs(base)[None] + np.abs(base).max())
    moved = moved.reshape(b, b, -1).any(-1)  # [probe r, row s]
    np.fill_diagonal(moved, False)
    return not bool(moved.any())
