"""What a check report and a gradient's NaN search say, as rows the Verify tab lists and the node
the `n` key goes to. No Textual here.

Rows: the verdict per x first (the headline), then every finding and every per-node result,
worst first: where NaN/Inf comes from and failing nodes, then the other findings, inconclusive
nodes, passing nodes, skipped ones; within a rank the largest relative error first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyRow:
    key: str
    label: str
    status: str
    abs_err: float | None
    rel_err: float | None
    where: str
    analytic: float | None
    numeric: float | None
    detail: str  # the whole reason or message, shown under the table for the highlighted row
    tensor: str | None = None  # Enter goes to this tensor...
    node: str | None = None  # ...or to this node (with `tensor` as its tensor when both are set)
    index: tuple[int, ...] | None = None
    resolved_by: str = ""  # an x's: what settled it when the first comparison did not (engine XCheck.resolved_by)


NONFINITE = ("nonfinite-gradient", "nonfinite-value", "nonfinite-native")
RANK = {"fail": 0, "inconclusive": 2, "pass": 3, "skipped": 4, "cancelled": 4}


def _status(v) -> str:
    return str(getattr(v, "value", v))


def _badness(err: float | None) -> float:
    """Sorts descending: NaN first, then larger errors, a missing one last."""
    if err is None:
        return -1.0
    return math.inf if math.isnan(err) else err


def _counts(r) -> str:
    kind = getattr(r, "kind", "elements")
    return (f"{getattr(r, 'checked', 0)} {kind} checked: {getattr(r, 'failed', 0)} failed, "
            f"{getattr(r, 'inconclusive', 0)} inconclusive")


def mode_text(report) -> str:
    """The mode the check used, "(auto)" when the engine chose it by size: "full (auto)"."""
    mode = getattr(report, "mode", "") or ""
    return f"{mode} (auto)" if mode and getattr(report, "auto", False) else mode


def _x_detail(report, r) -> str:
    """Why an x has its verdict: the mode that checked it and what resolved it, the engine's reason
    (else what was checked) and, for one left inconclusive (or cancelled), what would settle it."""
    mode = getattr(report, "mode", "")
    how = f"{mode} mode{' (auto)' if getattr(report, 'auto', False) else ''}" if mode else ""
    if settled := getattr(r, "resolved_by", ""):
        how += f", resolved by {settled}"
    text = ": ".join(t for t in (how, getattr(r, "reason", "") or _counts(r)) if t)
    if advice := getattr(r, "advice", ""):
        text += f"\nto settle it: {advice}"
    return text


def x_rows(report) -> list[VerifyRow]:
    rows = []
    for prefix, results in (("", report.results), ("d2/", getattr(report, "second_order", ()))):
        for r in results:
            worst = getattr(r, "worst_index", None)
            rows.append(VerifyRow(f"x:{prefix}{r.name}", prefix + r.name, _status(r.status),
                                  getattr(r, "max_abs_err", None), getattr(r, "max_rel_err", None),
                                  "" if worst is None else str(tuple(worst)), getattr(r, "analytic", None),
                                  getattr(r, "numeric", None), _x_detail(report, r), tensor=r.name,
                                  index=None if worst is None else tuple(int(i) for i in worst),
                                  resolved_by=getattr(r, "resolved_by", "")))
    return rows


def diagnosis_rows(report) -> list[VerifyRow]:
    """Findings and per-node results, worst first."""
    ranked = []
    for k, f in enumerate(getattr(report, "findings", ())):
        rank = -1 if f.kind in NONFINITE else 1
        label = f"note: {f.kind}" + (f" at {f.node}" if f.node else "")
        row = VerifyRow(f"finding:{k}", label, "NaN/Inf" if f.kind in NONFINITE else "note", None, None,
                        f.tensor or f.x or "", None, None, f.message, tensor=f.tensor or f.x, node=f.node)
        ranked.append(((rank, 0.0, k), row))
    for k, n in enumerate(getattr(report, "nodes", ())):
        status = _status(n.status)
        worst = getattr(n, "worst_index", None)
        where = f"{n.worst_input}{list(worst) if worst is not None else ''}" if n.worst_input else ""
        row = VerifyRow(f"node:{k}", f"◆ {n.node_name} ({n.op_type})", status, n.max_abs_err, n.max_rel_err, where,
                        n.analytic, n.numeric, n.reason or status, tensor=n.worst_input, node=n.node_name,
                        index=None if worst is None else tuple(int(i) for i in worst))
        ranked.append(((RANK.get(status, 4), -_badness(n.max_rel_err), k), row))
    return [row for _, row in sorted(ranked, key=lambda item: item[0])]


def verify_rows(report) -> list[VerifyRow]:
    return x_rows(report) + diagnosis_rows(report)


@dataclass(frozen=True)
class Culprit:
    """The node to look at first, and why."""

    node: str
    tensor: str | None
    why: str


def culprit(check, gradient_origin) -> Culprit | None:
    """The first failing node of a check, else where its NaN/Inf comes from, else where the last
    run's NaN/Inf comes from."""
    first = getattr(check, "first_failing_node", None) if check is not None else None
    if first:
        node = next((n for n in check.nodes if n.node_name == first), None)
        return Culprit(first, getattr(node, "worst_input", None), f"first failing node {first}")
    found = [f for f in getattr(check, "findings", ()) if f.kind in NONFINITE and f.node] if check is not None else []
    for f in found + ([gradient_origin] if gradient_origin is not None and gradient_origin.node else []):
        return Culprit(f.node, f.value or f.tensor, f.message)
    return None
