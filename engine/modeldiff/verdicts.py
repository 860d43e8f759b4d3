"""Culprits: a node that diverges locally while nothing diverging upstream of it explains it, the first
in topological order (forward) or reverse order (gradient) and then each independent branch's."""
from __future__ import annotations

from .report import FORWARD, GRADIENT, Divergence, NodeDiff

OVERFLOW = "overflow begins here"  # in a row's note: a culprit of its own, whatever diverged upstream


def culprits(rows: list[NodeDiff], units) -> tuple[Divergence, ...]:
    """Forward: taint flows from a diverging unit's outputs to its consumers; gradient: from its inputs'
    gradients (the tensors entering it) to their producers. A diverging unit no taint reached is a culprit."""
    by_name = {u.name: u for u in units}
    found = []
    for where in (FORWARD, GRADIENT):
        tainted: set[str] = set()
        for row in sorted((r for r in rows if r.where == where), key=lambda r: r.order):
            unit = by_name[row.node]
            upstream, downstream = (unit.inputs, unit.outputs) if where == FORWARD else (unit.outputs, unit.inputs)
            reached = any(t in tainted for t in upstream)
            if row.diverges and (not reached or OVERFLOW in row.note):
                found.append(Divergence(row.node, where, row.local_error, row.tolerance, row.op_type, row.note))
            if row.diverges or reached:
                tainted.update(downstream)
    return tuple(found)
