"""A report as plain text for the terminal: a line per x, per claim, per failing node, then findings."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .status import CANCELLED, FAIL, INCONCLUSIVE, PASS, SKIPPED

if TYPE_CHECKING:
    from .report import CheckReport, TransposeCheck, XCheck

MARK = {PASS: "PASS", FAIL: "FAIL", INCONCLUSIVE: "INCONCLUSIVE", SKIPPED: "skipped", CANCELLED: "cancelled"}


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _num(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _x_line(prefix: str, r: XCheck) -> list[str]:
    what = "directions" if r.kind == "directions" else "elements"
    where = ""
    if r.worst_index is not None and r.analytic is not None:
        where = f"  worst {list(r.worst_index)}: analytic {r.analytic:.6g} numeric {r.numeric:.6g} (fd err {_num(r.fd_error)})"
    elif r.worst_direction is not None and r.analytic is not None:
        where = f"  worst direction {r.worst_direction}: <g,u> {r.analytic:.6g} vs fd {r.numeric:.6g}"
    counts = f"{r.checked}/{r.total if r.kind == 'elements' else r.checked} {what}"
    if r.failed or r.inconclusive:
        counts += f", {r.failed} failed, {r.inconclusive} inconclusive"
    settled = f"  (resolved: {r.resolved_by})" if r.resolved_by else ""
    lines = [f"  {MARK.get(r.status, r.status):12} {prefix}{r.name}  {counts}  max abs {_num(r.max_abs_err)} "
             f"rel {_num(r.max_rel_err)}{where}{settled}"]
    if r.native_dtype:
        judged = ""
        if r.native_status:
            judged = (f"; rounding the values to {r.native_dtype} alone moves it {_num(r.native_rounding_err)}: "
                      + ("within" if r.native_status == PASS else "BEYOND") + f" {r.native_dtype} precision")
        lines.append(f"               {r.native_dtype} gradient vs float64: max abs {_num(r.native_max_abs_err)} "
                     f"rel {_num(r.native_max_rel_err)}{judged}")
    if r.reason and (r.status != PASS or not r.checked):  # a pass with nothing perturbed says why
        lines.append(f"               {r.reason}")
    if r.advice:
        lines.append(f"               to settle it: {r.advice}")
    return lines


def _transpose_line(t: TransposeCheck) -> list[str]:
    numbers = "" if t.forward is None else (f"  <u,J·v> {t.forward:.10g} vs <Jᵀu,v> {t.reverse:.10g}  abs {_num(t.abs_err)} "
                                            f"rel {_num(t.rel_err)}  rounding {_num(t.error_estimate)}")
    lines = [f"  {MARK.get(t.status, t.status):12} transpose {t.name}{numbers}"]
    if t.reason and (t.status != PASS or t.forward is None):
        lines.append(f"               {t.reason}")
    return lines


def format_report(report: CheckReport) -> str:
    head = (f"check d{report.y}/d[{', '.join(report.xs)}]  mode {report.mode}{' (auto)' if report.auto else ''}"
            f"{f' ({report.samples} samples)' if report.samples else ''}"
            f"{f' ({report.directions} direction{_s(report.directions)})' if report.directions else ''}  "
            f"order {report.order}{' (H·v)' if report.second_order_method == 'hvp' else ''}"
            f"{'  forward' if report.forward else ''}  "
            f"dy {report.dy}  seed {report.seed}  rtol {report.rtol:g}  "
            f"atol {'auto' if report.atol is None else format(report.atol, 'g')}")
    lines = [head]
    for r in report.results:
        lines += _x_line("", r)
    for r in report.second_order:
        lines += _x_line("H·v " if r.kind == "tangent" else "d2/", r)
    for r in report.jvp:
        lines += _x_line("J·v ", r)
    for t in report.transpose:
        lines += _transpose_line(t)
    for c in report.claimed:
        lines.append(f"  {MARK.get(c.status, c.status):12} claimed {c.output} = d{report.y}/d{c.x}  "
                     f"vs engine max abs {_num(c.max_abs_err_vs_engine)}  vs fd max abs {_num(c.max_abs_err_vs_fd)}"
                     + (f"  {c.reason}" if c.reason else ""))
    if report.nodes:
        counts = {}
        for n in report.nodes:
            counts[n.status] = counts.get(n.status, 0) + 1
        lines.append("  nodes: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        for n in report.nodes:
            if n.status in (FAIL, INCONCLUSIVE):
                lines.append(f"  {MARK[n.status]:12} node {n.node_name} ({n.op_type})  max abs {_num(n.max_abs_err)} "
                             f"rel {_num(n.max_rel_err)}  {n.reason}")
    if report.first_failing_node:
        lines.append(f"  first failing node: {report.first_failing_node}")
    for f in report.findings:
        lines.append(f"  note [{f.kind}]: {f.message}")
    lines.append(f"verdict: {report.verdict.upper()}  ({report.elapsed_s:.2f}s)")
    return "\n".join(lines)
