"""Per-op summaries of a conformance run: the coverage table (docs/ops.md) and the failure list."""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..registry import supported_ops
from .gradients import GradientOutcome, inconclusive_kind, op_gradient_status
from .runner import CaseOutcome
from .status import (
    ERROR,
    FAIL,
    FORWARD_STATUSES,
    INCONCLUSIVE,
    MISMATCH,
    NONFINITE,
    PASS,
    UNSUPPORTED_OP,
    UNSUPPORTED_TYPE,
)


@dataclass(frozen=True)
class OpCoverage:
    op: str
    opsets: str  # registered opset ranges, '' when the engine has no implementation
    passed: int
    total: int
    expanded_passed: int
    expanded_total: int
    statuses: dict = field(default_factory=dict)  # status -> count over both kinds of case
    gradient: str = ""
    gradient_note: str = ""


@dataclass(frozen=True)
class Column:
    """One more column of docs/ops.md, filled by a sweep: a cell (status) and a note per op."""

    title: str
    legend: str  # a sentence for the Columns paragraph
    summary: str  # a line under the forward and gradient totals
    cells: dict = field(default_factory=dict)  # op -> (status, note)


def registered_ranges() -> dict[str, str]:
    """Registered opsets per op, the onnxruntime contrib domain aside (its own sweep and table: contrib_report)."""
    ranges: dict[str, list[str]] = collections.defaultdict(list)
    for impl in supported_ops():
        if impl.domain == "com.microsoft":
            continue
        op = impl.op_type if not impl.domain else f"{impl.domain}::{impl.op_type}"
        ranges[op].append(str(impl.since) if impl.until == impl.since else impl.opset_range)
    return {op: ", ".join(r) for op, r in ranges.items()}


def coverage(outcomes: Sequence[CaseOutcome], gradients: Sequence[GradientOutcome] = ()) -> list[OpCoverage]:
    ranges = registered_ranges()
    by_op: dict[str, list[CaseOutcome]] = collections.defaultdict(list)
    for o in outcomes:
        by_op[o.op].append(o)
    grads: dict[str, list[GradientOutcome]] = collections.defaultdict(list)
    for g in gradients:
        grads[g.op].append(g)
    rows = []
    for op in sorted(set(by_op) | set(ranges), key=str.lower):
        cases = by_op.get(op, [])
        direct = [o for o in cases if not o.expanded]
        expanded = [o for o in cases if o.expanded]
        status, note = op_gradient_status(grads[op]) if grads.get(op) else ("", "")
        rows.append(OpCoverage(
            op=op, opsets=ranges.get(op, ""),
            passed=sum(o.status == PASS for o in direct), total=len(direct),
            expanded_passed=sum(o.status == PASS for o in expanded), expanded_total=len(expanded),
            statuses=dict(collections.Counter(o.status for o in cases)),
            gradient=status, gradient_note=note,
        ))
    return rows


def counts(outcomes: Iterable) -> dict[str, int]:
    c = collections.Counter(o.status for o in outcomes)
    return {s: c.get(s, 0) for s in FORWARD_STATUSES}


def _cell(passed: int, total: int) -> str:
    return f"{passed} / {total}" if total else "–"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _accepted(outcomes) -> str:
    n = sum(bool(o.documented) for o in outcomes)
    return f" ({n} documented, see engine/conformance/runner.py)" if n else ""


def ops_markdown(rows: Sequence[OpCoverage], outcomes: Sequence[CaseOutcome],
                 gradients: Sequence[GradientOutcome], header: str, columns: Sequence[Column] = ()) -> str:
    c = counts(outcomes)
    g = collections.Counter(o.status for o in gradients)
    lines = [
        "# Op coverage",
        "",
        header,
        "",
        f"Forward: **{c[PASS]} of {len(outcomes)}** ONNX node test cases pass "
        f"({c[MISMATCH]} mismatch{_accepted(outcomes)}, {c[ERROR]} error, {c[UNSUPPORTED_OP]} unsupported op, "
        f"{c[UNSUPPORTED_TYPE]} unsupported type).",
        "Gradients (forward-passing cases, float64 finite differences): "
        + ", ".join(f"{n} {s}" for s, n in sorted(g.items(), key=lambda kv: -kv[1])) + ".",
        *[col.summary for col in columns],
        "",
        "Columns: *opsets* are the registered implementations; *cases* are onnx's single-node tests of "
        "the op, *expanded* the same tests with the op replaced by its function body (they exercise "
        "the primitives inside); *gradient* is the verdict over the op's forward-passing cases: "
        "`pass`, `inconclusive` (only at a kink, named), `fail`, `error` (the backward raised), "
        "`non-finite`, `not differentiable` (the schema tags no float input differentiable) or "
        "`not checked`." + "".join(f" {col.legend}" for col in columns),
        "",
        "| op | opsets | cases | expanded | gradient | " + "".join(f"{col.title} | " for col in columns) + "note |",
        "|---|---|---|---|---|" + "---|" * len(columns) + "---|",
    ]
    for r in rows:
        cells = [col.cells.get(r.op, ("", "")) for col in columns]
        note = "; ".join([_md(r.gradient_note)[:160]] + [f"{col.title}: {_md(n)[:160]}" for col, (_, n) in
                                                         zip(columns, cells) if n])
        lines.append(f"| {r.op} | {r.opsets or '–'} | {_cell(r.passed, r.total)} | "
                     f"{_cell(r.expanded_passed, r.expanded_total)} | {r.gradient or '–'} | "
                     + "".join(f"{status or '–'} | " for status, _ in cells) + f"{note} |")
    return "\n".join(lines) + "\n"


def short_reason(message: str) -> str:
    """An unsupported-op message without the list of every supported op."""
    m = re.search(r"op (\S+) \(opset (\d+)\) is not supported", message)
    if m:
        return f"no implementation of {m.group(1)} (opset {m.group(2)})"
    m = re.search(r"(\S+) is supported for opsets (.*), not opset (\d+)", message)
    if m:
        return f"{m.group(1)} registered for opsets {m.group(2)}, not {m.group(3)}"
    return message


def localize(outcome: CaseOutcome) -> str:
    from .cases import case_named
    from .diagnose import first_divergence

    try:
        return first_divergence(case_named(outcome.name)) or "every intermediate matches the reference"
    except Exception as exc:  # diagnosis is best effort; the failure itself is already listed
        return f"(could not localize: {type(exc).__name__})"


def failures_markdown(outcomes: Sequence[CaseOutcome], peer: Sequence[CaseOutcome] | None = None,
                      gradients: Sequence[GradientOutcome] = (), title: str = "Conformance failures") -> str:
    """Failing cases grouped by the op under test, with the reason, for the op owners."""
    peer_status = {o.name: o.status for o in peer or ()}
    c = counts(outcomes)
    others = ", ".join(f"{n} {s}" for s, n in c.items() if s != PASS and n)
    lines = [f"# {title}", "", f"Forward: {c[PASS]} / {len(outcomes)} pass" + (f"; {others}." if others else ".")]
    if peer is not None:
        lines.extend(_peer_lines(outcomes, peer, peer_status))
    for status, heading, full in ((MISMATCH, "Mismatch", True), (ERROR, "Error", True),
                                  (UNSUPPORTED_OP, "Unsupported op", False),
                                  (UNSUPPORTED_TYPE, "Unsupported type", False)):
        lines.extend(_forward_section(outcomes, status, heading, full, peer_status, peer is not None))
    if gradients:
        lines.extend(_gradient_lines(gradients))
    return "\n".join(lines) + "\n"


def _peer_lines(outcomes: Sequence[CaseOutcome], peer: Sequence[CaseOutcome], peer_status: dict) -> list[str]:
    """onnxruntime's total, and the commonest reasons among the cases it passes and we do not."""
    pc = counts(peer)
    lines = [f"onnxruntime on the same runner: {pc[PASS]} / {len(peer)} pass."]
    gaps = collections.Counter()
    for o in outcomes:
        if o.status != PASS and peer_status.get(o.name) == PASS:
            gaps[short_reason(o.message) if o.status == UNSUPPORTED_OP else f"{o.op}: {o.status}"] += 1
    if gaps:
        lines.extend(["", "Biggest gaps (cases onnxruntime passes and we do not, by first reason):", ""])
        lines.extend(f"- {n} × {reason[:120]}" for reason, n in gaps.most_common(25))
    return lines


def _forward_section(outcomes: Sequence[CaseOutcome], status: str, heading: str, full: bool, peer_status: dict,
                     with_peer: bool) -> list[str]:
    """The cases of one status by op: each case with its message when `full`, else a line per op."""
    bad = [o for o in outcomes if o.status == status]
    if not bad:
        return []
    lines = ["", f"## {heading} ({len(bad)})", ""]
    by_op: dict[str, list[CaseOutcome]] = collections.defaultdict(list)
    for o in bad:
        by_op[o.op].append(o)
    for op in sorted(by_op, key=str.lower):
        group = by_op[op]
        if full:
            lines.append(f"- **{op}** ({len(group)})")
            for o in group:
                inside = f" — {localize(o)}" if len(o.ops) > 1 and status == MISMATCH else ""
                why = f" — accepted: {o.documented}" if o.documented else ""
                ort = f" (onnxruntime: {peer_status[o.name]})" if o.name in peer_status else ""
                lines.append(f"  - `{o.name}`{ort}: {o.message}{inside}{why}")
        else:
            names = ", ".join(f"`{o.name}`" for o in group[:4]) + (" …" if len(group) > 4 else "")
            peer_pass = sum(peer_status.get(o.name) == PASS for o in group)
            extra = f"; onnxruntime passes {peer_pass}" if with_peer else ""
            reasons = sorted({short_reason(o.message)[:140] for o in group})
            lines.append(f"- **{op}** ({len(group)}{extra}): {'; '.join(reasons[:3])} — {names}")
    return lines


def _gradient_lines(gradients: Sequence[GradientOutcome]) -> list[str]:
    """The gradient totals, then the failing, documented and inconclusive cases."""
    gc = collections.Counter(o.status for o in gradients)
    lines = ["", "## Gradients", "", "Checked: " + ", ".join(f"{n} {s}" for s, n in gc.most_common()) + "."]
    groups = [
        ("Failing (bugs to fix)", [o for o in gradients if o.status in (FAIL, ERROR, NONFINITE) and not o.documented]),
        ("Documented disagreements", [o for o in gradients if o.documented]),
        ("Inconclusive", [o for o in gradients if o.status == INCONCLUSIVE]),
    ]
    for heading, group in groups:
        if not group:
            continue
        lines.extend(["", f"### {heading} ({len(group)})", ""])
        for o in group:
            why = f" — accepted: {o.documented}" if o.documented else ""
            kind = f"[{inconclusive_kind(o.reason)}] " if o.status == INCONCLUSIVE else ""
            lines.append(f"- {o.status}: **{o.op}** `{o.name}`: {kind}{o.reason}{why}")
    return lines
