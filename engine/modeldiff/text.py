"""The diff report as words: the culprit line the CLI prints first, and JUnit XML (one testcase per
compared node and direction, a failure where it diverges locally)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from .report import DiffReport, Divergence


def culprit_line(report: DiffReport, culprit: Divergence | None = None, label: str = "first divergence") -> str:
    """"first divergence: node 'fc1' (Gemm), forward: error 9.3e-03 > tolerance 1.9e-06; inputs arrived
    within 0e+00", or that nothing diverges."""
    culprit = culprit or report.first_divergence
    if culprit is None:
        compared = len(report.nodes)
        return f"no divergence: {compared} node comparisons within tolerance ({report.a} vs {report.b})"
    row = next((n for n in report.nodes if n.node == culprit.node and n.where == culprit.where), None)
    arrived = max((e for _, e in row.input_errors), default=0.0) if row is not None else 0.0
    note = f" ({culprit.note})" if culprit.note else ""
    return (f"{label}: node {culprit.node!r} ({culprit.op_type}), {culprit.where}: error {culprit.error:.2g} > "
            f"tolerance {culprit.tolerance:.2g}; inputs arrived within {arrived:.2g}{note}")


def junit_xml(report: DiffReport) -> str:
    failures = [n for n in report.nodes if n.diverges]
    suite = ET.Element("testsuite", name=f"onnxgrad.diff {report.a} vs {report.b}", tests=str(len(report.nodes)),
                       failures=str(len(failures)), errors="0", time=f"{report.elapsed_s:.3f}")
    for n in report.nodes:
        case = ET.SubElement(suite, "testcase", classname=f"onnxgrad.{n.where}", name=f"{n.node} ({n.op_type})")
        if n.diverges:
            message = f"local error {n.local_error:.3g} > tolerance {n.tolerance:.3g}"
            ET.SubElement(case, "failure", message=message + (f"; {n.note}" if n.note else "")).text = message
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)
