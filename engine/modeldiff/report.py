"""What `onnxgrad diff` reports: one row per compared node, forward and gradient, and the first node
whose own (local) error goes beyond tolerance. The values that cross into the CLI, the HTML report,
the explorer and Model Explorer's node data; docs/diff.md documents the JSON (`schema_version` 1:
fields may be added later, none renamed or removed).

Errors are relative to the value's scale: max |a − b| / max(max |a|, max |b|, tiny). A tolerance is in
the same unit, derived from the lower of the two dtypes (units of its epsilon, see engine/modeldiff/tolerance.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np

SCHEMA_VERSION = 1
FORWARD, GRADIENT = "forward", "gradient"


@dataclass(frozen=True)
class NodeDiff:
    """One of A's nodes (or a span of them that one fused B node stands for), compared with its match in B.

    where: "forward" (its outputs' values) or "gradient" (the gradient flowing into its inputs from y).
    error: the accumulated difference of its outputs (forward) or of the gradients it sends (gradient),
    the worst over them. local_error: the same difference when B's matched node(s) are replayed on A's
    input values (forward) or A's incoming gradient (gradient): what this node adds by itself.
    diverges: local_error > tolerance. input_errors: the accumulated error of each input as it arrived
    (forward: the inputs; gradient: the gradients of its outputs), by A's tensor name."""

    node: str
    op_type: str
    where: str
    order: int  # position in the comparison order: topological for forward, reverse for gradient
    b_nodes: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    error: float = 0.0
    local_error: float = 0.0
    tolerance: float = 0.0
    diverges: bool = False
    input_errors: tuple[tuple[str, float], ...] = ()
    note: str = ""  # e.g. "float16 overflow begins here", "initializer 'w' differs", "span of 5 nodes"


@dataclass(frozen=True)
class Divergence:
    """Where a difference begins: a node that diverges locally while its inputs arrived within tolerance."""

    node: str
    where: str
    error: float
    tolerance: float
    op_type: str = ""
    note: str = ""


@dataclass(frozen=True)
class Unmatched:
    """A tensor of one side that nothing on the other side was matched to (listed, never guessed)."""

    side: str  # "a" or "b"
    tensor: str
    producer: str = ""  # the node that computes it ("" for inputs and initializers)
    why: str = ""


@dataclass(frozen=True)
class DiffValues:
    """The values behind the rows, kept only when asked (`diff(..., keep_values=True)`): for each of A's
    tensors a unit computes, (A's value, B's value as B computed it), as numpy arrays in their own dtype
    (bfloat16 as float32). `gradient` holds the gradient flowing into each tensor from y, A's and B's."""

    forward: Mapping[str, tuple[np.ndarray | None, np.ndarray | None]] = field(default_factory=dict)
    gradient: Mapping[str, tuple[np.ndarray | None, np.ndarray | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class DiffReport:
    a: str  # what A is: a path, or "MODEL" for the one-model forms
    b: str  # a path, "MODEL as float16", or "onnxruntime"
    mode: str  # "models", "dtype" or "onnxruntime"
    y: str | None = None
    xs: tuple[str, ...] = ()
    zs: tuple[str, ...] = ()
    nodes: tuple[NodeDiff, ...] = ()
    culprits: tuple[Divergence, ...] = ()  # the first divergence of each independent branch, in order
    unmatched: tuple[Unmatched, ...] = ()
    matched_tensors: int = 0
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    # A's node -> node edges by node name, so the report draws its graph alone (HTML, Jupyter); not in the JSON.
    edges: tuple[tuple[str, str], ...] = ()
    values: DiffValues | None = None  # with keep_values=True (the explorer's inspector); not in the JSON

    @property
    def first_divergence(self) -> Divergence | None:
        """The forward culprit first (topological order); else the gradient's (reverse order)."""
        for where in (FORWARD, GRADIENT):
            found = [c for c in self.culprits if c.where == where]
            if found:
                return found[0]
        return None

    @property
    def diverges(self) -> bool:
        return any(n.diverges for n in self.nodes)

    @property
    def exit_code(self) -> int:
        """0 when nothing diverges beyond tolerance, 1 when something does (2 is bad input, raised before)."""
        return 1 if self.diverges else 0

    def worst(self, where: str | None = None) -> list[NodeDiff]:
        """Nodes by local error over tolerance, worst first."""
        rows = [n for n in self.nodes if where is None or n.where == where]
        return sorted(rows, key=lambda n: -_ratio(n.local_error, n.tolerance))

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": not self.diverges,
            "a": self.a, "b": self.b, "mode": self.mode, "y": self.y, "xs": list(self.xs), "zs": list(self.zs),
            "first_divergence": None if first is None else {
                "node": first.node, "where": first.where, "error": _num(first.error),
                "tolerance": _num(first.tolerance), "op_type": first.op_type, "note": first.note},
            "culprits": [{**asdict(c), "error": _num(c.error), "tolerance": _num(c.tolerance)} for c in self.culprits],
            "nodes": [_node_dict(n) for n in self.nodes],
            "unmatched": [asdict(u) for u in self.unmatched],
            "matched_tensors": self.matched_tensors,
            "elapsed_s": round(self.elapsed_s, 4),
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def _repr_html_(self) -> str:
        """Jupyter shows the self-contained HTML report inline."""
        from .html import report_fragment  # lazy cycle: html.py imports this module's values

        return report_fragment(self)


def _ratio(error: float, tolerance: float) -> float:
    if tolerance > 0:
        return error / tolerance
    return math.inf if error > 0 else 0.0


def _num(x: float):
    """JSON has no NaN or Inf: written as strings, as check reports do."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _node_dict(n: NodeDiff) -> dict:
    out = asdict(n)
    out.update(b_nodes=list(n.b_nodes), outputs=list(n.outputs), error=_num(n.error),
               local_error=_num(n.local_error), tolerance=_num(n.tolerance),
               input_errors=[[t, _num(e)] for t, e in n.input_errors])
    return out
