"""Diff mode's state: the job that runs `engine.diff` in a worker and the report on screen, read as
marks per node, the culprit `n` goes to and the value pairs the inspector shows. No Textual.

A node's mark in the shown direction (forward or gradient): "fail" where it diverges by itself
(local error beyond tolerance), "inconclusive" where it only carries a difference from upstream
(error beyond tolerance, local error within), "pass" where it agrees; a node the diff did not
compare has no mark. The graph and the navigator draw these with the verdict colours of `check`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

import engine
from engine.errors import DiffError

FORWARD, GRADIENT = "forward", "gradient"
HALF_TYPES = ("float16", "bfloat16")
AGAINST = "onnxruntime"


@dataclass(frozen=True)
class DiffChoice:
    """What the diff dialog asked for: a second model file, a half dtype, or onnxruntime."""

    b: str | None = None
    dtype: str | None = None
    against: str | None = None

    def describe(self) -> str:
        """What A is compared with: "vs B.onnx", "vs float16", "vs onnxruntime"."""
        return f"vs {os.path.basename(self.b) if self.b else self.dtype or self.against}"


@dataclass(frozen=True)
class DiffJob:
    """Everything one diff needs, copied from the session when it was asked for."""

    model: engine.Model
    choice: DiffChoice
    feeds: dict[str, np.ndarray]
    y: str | None = None
    xs: tuple[str, ...] = ()
    zs: tuple[str, ...] = ()
    dims: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    device: str = "cpu"
    basis: tuple = ()  # diff_basis of the session when asked: once it changes, the diff shown is stale

    def run(self) -> engine.DiffReport:
        c = self.choice
        # onnxruntime reads A's file again; the other forms reuse the Model already loaded.
        a = self.model.graph.path if c.against else self.model
        if c.against and not a:
            raise DiffError("diff against onnxruntime needs the model's file: this model has none")
        b = os.path.expanduser(c.b) if c.b else None
        return engine.diff(a, b, self.y, self.xs, self.zs, self.feeds, dims=self.dims or None, seed=self.seed,
                           dtype=c.dtype, against=c.against, device=self.device, keep_values=True)


def diff_job(session, choice: DiffChoice) -> DiffJob:
    """The session's model, feeds and dims; its selection when complete (else the forward alone)."""
    spec = session.spec
    y, xs, zs = (spec.y, tuple(spec.xs), tuple(spec.zs)) if spec is not None else (None, (), ())
    return DiffJob(session.model, choice, session.feed_values(), y, xs, zs,
                   dict(session.dims), session.seed, session.device, diff_basis(session))


def diff_basis(session) -> tuple:
    """What of the session a diff depends on: selection, feeds, dims, seed, device (not the dtype: A runs
    in its own, B in its own or the half type chosen)."""
    spec = session.spec
    selection = (spec.y, tuple(spec.xs), tuple(spec.zs)) if spec is not None else None
    return (selection, tuple(sorted((n, repr(f)) for n, f in session.feeds.items())), tuple(sorted(session.dims.items())),
            session.seed, session.device)


@dataclass(frozen=True)
class DiffCulprit:
    """Where `n` goes in diff mode (verdicts.Culprit's fields, plus the direction it diverges in)."""

    node: str
    tensor: str | None
    why: str
    where: str


@dataclass
class DiffShown:
    """The diff on screen: its report and the direction (forward or gradient) the colours show."""

    report: engine.DiffReport
    choice: DiffChoice
    where: str = FORWARD
    basis: tuple = ()  # diff_basis of the session it was computed for
    _rows: dict = field(default_factory=dict, repr=False)
    cache: dict = field(default_factory=dict, repr=False)  # (where, tensor) -> what the inspector drew of it

    @classmethod
    def of(cls, report: engine.DiffReport, choice: DiffChoice, basis: tuple = ()) -> "DiffShown":
        first = report.first_divergence
        shown = cls(report, choice, first.where if first is not None else FORWARD, basis)
        for r in report.nodes:  # a node compared twice in one direction (a span's edges): its worst row
            old = shown._rows.get((r.where, r.node))
            if old is None or _over(r) > _over(old):
                shown._rows[(r.where, r.node)] = r
        return shown

    @property
    def label(self) -> str:
        return self.choice.describe()

    def stale(self, session) -> bool:
        """The feeds, dims, device or selection changed since it was computed."""
        return diff_basis(session) != self.basis

    @property
    def has_gradient(self) -> bool:
        return any(where == GRADIENT for where, _ in self._rows)

    def toggle(self) -> str:
        self.where = GRADIENT if self.where == FORWARD else FORWARD
        return self.where

    def row(self, node: str, where: str | None = None):
        """The NodeDiff of `node` in `where` (default: the direction shown), or None if not compared."""
        return self._rows.get((where or self.where, node))

    def node_marks(self, graph) -> dict[int, str]:
        """Node index -> "fail" / "inconclusive" / "pass" in the direction shown (uncompared: absent)."""
        marks = {}
        for k, name in enumerate(graph.node_names):
            r = self._rows.get((self.where, name))
            if r is not None:
                marks[k] = "fail" if r.diverges else "inconclusive" if r.error > r.tolerance else "pass"
        return marks

    def culprit(self, graph) -> DiffCulprit | None:
        """The first node diverging by itself in the direction shown, else the report's first divergence."""
        shown = [c for c in self.report.culprits if c.where == self.where]
        found = shown[0] if shown else self.report.first_divergence
        if found is None:
            return None
        k = graph.node_names.index(found.node) if found.node in graph.node_names else None
        outputs = [t for t in graph.nodes[k].output if t] if k is not None else []
        why = (f"{found.where}: local error {found.error:.2g} > tolerance {found.tolerance:.2g}"
               + (f"; {found.note}" if found.note else ""))
        return DiffCulprit(found.node, outputs[0] if outputs else None, why, found.where)

    def pairs(self, tensors, where: str | None = None) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(tensor, A's, B's) for those of `tensors` the diff kept both sides of: values (forward)
        or the gradient flowing into them from y (gradient)."""
        values = self.report.values
        if values is None:
            return []
        kept = values.gradient if (where or self.where) == GRADIENT else values.forward
        out = []
        for t in tensors:
            a, b = kept.get(t, (None, None))
            if a is not None and b is not None:
                out.append((t, np.asarray(a), np.asarray(b)))
        return out

    def headline(self) -> str:
        """One line: how many nodes diverge by themselves, and where the first one is."""
        report = self.report
        diverging = sorted({r.node for r in report.nodes if r.diverges})
        if not diverging:
            compared = len(report.nodes)
            return f"no divergence: {compared} node comparison{'s' if compared != 1 else ''} within tolerance"
        first = report.first_divergence
        return (f"{len(diverging)} node{'s' if len(diverging) != 1 else ''} diverge{'s' if len(diverging) == 1 else ''}"
                f"; first: {first.node} ({first.where})")


def _over(r) -> float:
    return r.local_error / r.tolerance if r.tolerance > 0 else float("inf") if r.local_error > 0 else 0.0
