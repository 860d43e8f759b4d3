"""What a check found, as frozen values: per-x results, per-node results, findings; JSON and JUnit out.

The JSON layout is documented in docs/check-json.md and versioned by SCHEMA_VERSION; add fields,
never rename or remove them.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from .status import CANCELLED, FAIL, INCONCLUSIVE, PASS, SKIPPED  # noqa: F401  (report users read them here)
from .text import format_report

SCHEMA_VERSION = 2  # 2: forward, jvp, transpose, second_order_method


@dataclass(frozen=True)
class ItemProblem:
    """One element (or direction) that failed or was inconclusive."""

    status: str
    index: tuple[int, ...] | None  # element index into x; None for a direction
    direction: int | None
    analytic: float
    numeric: float
    abs_err: float
    rel_err: float
    fd_error: float
    reason: str


@dataclass(frozen=True)
class XCheck:
    """The verdict for one member of xs (or, in `second_order`, for its gradient's gradient)."""

    name: str
    status: str
    max_abs_err: float | None
    max_rel_err: float | None
    worst_index: tuple[int, ...] | None
    analytic: float | None
    numeric: float | None
    fd_error: float | None
    checked: int
    failed: int
    inconclusive: int
    reason: str = ""
    kind: str = "elements"  # "elements" (full, sample) or "directions" (fast)
    shape: tuple[int, ...] = ()
    total: int = 0  # elements in x
    worst_direction: int | None = None
    step: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0  # the absolute tolerance applied at the worst item
    strategy: str = ""  # how perturbed forwards were batched: native, vmap or loop
    rows: int = 1  # independent rows perturbed together (1: none)
    forwards: int = 0  # perturbed evaluations spent on this x
    native_dtype: str | None = None
    native_max_abs_err: float | None = None
    native_max_rel_err: float | None = None
    native_status: str | None = None  # half types: pass when within the dtype's precision (verify/native.py)
    native_rounding_err: float | None = None  # half types: what rounding the values alone moves the gradient
    problems: tuple[ItemProblem, ...] = ()
    # How the verdict was reached (docs/check-json.md, "Verdicts"): the size of the quantity the worst
    # item compared, against which its error and tolerance must be small for a pass ...
    signal: float | None = None
    # ... how an x the first comparison left unresolved was resolved ("" when it was not needed):
    # "aligned dy", "more directions" or "nodes" ...
    resolved_by: str = ""
    # ... and, for an inconclusive x, what would settle it.
    advice: str = ""


@dataclass(frozen=True)
class NodeCheck:
    """One node on the y <- xs path, its VJP checked alone on the values it saw."""

    node_name: str
    op_type: str
    status: str
    max_abs_err: float | None
    max_rel_err: float | None
    reason: str = ""
    node_index: int = -1
    inputs: tuple[str, ...] = ()
    worst_input: str | None = None
    worst_index: tuple[int, ...] | None = None
    analytic: float | None = None
    numeric: float | None = None
    kind: str = "elements"


@dataclass(frozen=True)
class ClaimedCheck:
    """A gradient the model computes itself (output `output`) against the engine and finite differences."""

    x: str
    output: str
    status: str
    max_abs_err_vs_engine: float | None
    max_rel_err_vs_engine: float | None
    max_abs_err_vs_fd: float | None
    max_rel_err_vs_fd: float | None
    worst_index: tuple[int, ...] | None
    claimed: float | None
    engine: float | None
    numeric: float | None
    reason: str = ""


@dataclass(frozen=True)
class TransposeCheck:
    """For one x: <u, J·v> by forward mode against <Jᵀu, v> by reverse mode, judged by their rounding."""

    name: str
    status: str
    forward: float | None  # <u, J·v>
    reverse: float | None  # <Jᵀu, v>
    abs_err: float | None
    rel_err: float | None
    error_estimate: float | None  # the rounding allowance the difference was judged against
    signal: float | None  # max(|forward|, |reverse|)
    roundoff: str = ""  # "dot product", or "measured" when each side's rounding was sampled too
    reason: str = ""


@dataclass(frozen=True)
class Finding:
    """Something worth knowing that is not a per-element verdict: NaN/Inf, precision, nondeterminism."""

    kind: str
    message: str
    tensor: str | None = None
    node: str | None = None
    x: str | None = None
    value: str | None = None  # nonfinite-gradient: the forward value that made the VJP non-finite
    hidden_by: str | None = None  # ...and the node downstream whose finite output hides it


@dataclass(frozen=True)
class CheckReport:
    ok: bool
    verdict: str  # pass | fail | inconclusive | cancelled
    mode: str
    seed: int
    order: int
    results: tuple[XCheck, ...]
    auto: bool = False  # the mode was chosen by size (no mode asked for)
    nodes: tuple[NodeCheck, ...] = ()
    first_failing_node: str | None = None
    findings: tuple[Finding, ...] = ()
    elapsed_s: float = 0.0
    model: str = ""
    y: str = ""
    xs: tuple[str, ...] = ()
    zs: tuple[str, ...] = ()
    dy: str = ""  # "scalar", "ones", "given" or "random:SEED"
    rtol: float = 0.0
    atol: float | None = None  # None: scaled to each x's gradient (see docs/check-json.md)
    samples: int | None = None
    directions: int | None = None
    second_order: tuple[XCheck, ...] = ()
    claimed: tuple[ClaimedCheck, ...] = ()
    truncated: bool = False  # a time budget or a cancel left items unchecked
    stopped: str = ""  # "", "cancelled" or "time budget"
    device: str = "cpu"
    forward: bool = False  # forward mode was checked too (`jvp`, `transpose`)
    jvp: tuple[XCheck, ...] = ()  # per x: J·v against central differences along v, items the elements of y
    transpose: tuple[TransposeCheck, ...] = ()
    second_order_method: str = ""  # with order 2: "gradgrad" (create_graph) or "hvp" (forward over reverse)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_junit(self) -> str:
        return junit_xml(self)

    def summary(self) -> str:
        return format_report(self)


def _plain(value):
    """JSON-safe: tuples become lists, non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def junit_xml(report: CheckReport) -> str:
    """One testsuite; a testcase per x, per second-order x, per claimed gradient and per checked node."""
    cases: list[tuple[str, str, str, str]] = []  # (classname, name, status, message)
    for r in report.results:
        cases.append(("gradient", f"d{report.y}/d{r.name}", r.status, _x_message(r)))
    for r in report.second_order:
        cases.append(("second_order", f"d2{report.y}/d{r.name}2", r.status, _x_message(r)))
    for r in report.jvp:
        cases.append(("jvp", f"d{report.y}/d{r.name}·v", r.status, _x_message(r)))
    for t in report.transpose:
        cases.append(("transpose", f"<u, J·v> = <Jᵀu, v> for {t.name}", t.status, t.reason))
    for c in report.claimed:
        cases.append(("claimed", f"{c.output} as d{report.y}/d{c.x}", c.status, c.reason))
    for n in report.nodes:
        cases.append(("node", f"{n.node_name} ({n.op_type})", n.status, n.reason))
    suite = ET.Element("testsuite", name=f"onnxgrad.check {report.model}".strip(), tests=str(len(cases)),
                       failures=str(sum(c[2] == FAIL for c in cases)),
                       skipped=str(sum(c[2] in (INCONCLUSIVE, SKIPPED, CANCELLED) for c in cases)),
                       errors="0", time=f"{report.elapsed_s:.3f}")
    props = ET.SubElement(suite, "properties")
    for key in ("verdict", "mode", "seed", "order", "dy", "rtol"):
        ET.SubElement(props, "property", name=key, value=str(getattr(report, key)))
    for classname, name, status, message in cases:
        case = ET.SubElement(suite, "testcase", classname=f"onnxgrad.{classname}", name=name)
        if status == FAIL:
            ET.SubElement(case, "failure", message=message or "gradient mismatch").text = message
        elif status in (INCONCLUSIVE, SKIPPED, CANCELLED):
            ET.SubElement(case, "skipped", message=f"{status}: {message}".rstrip(": "))
    if report.findings:
        ET.SubElement(suite, "system-out").text = "\n".join(f"{f.kind}: {f.message}" for f in report.findings)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def _x_message(r: XCheck) -> str:
    if r.status == PASS:
        return ""
    where = f"element {list(r.worst_index)}" if r.worst_index is not None else f"direction {r.worst_direction}"
    base = (f"{where}: analytic {r.analytic:.6g}, numeric {r.numeric:.6g}, "
            f"abs err {r.max_abs_err:.3g}, rel err {r.max_rel_err:.3g}") if r.analytic is not None else ""
    return "; ".join(p for p in (base, r.reason) if p)
