"""Conformance: ONNX's own node test cases through the engine (forward), and every passing
differentiable case against finite differences (gradients).

    from engine.conformance import run_suite
    from engine.conformance.report import counts
    outcomes = run_suite()                       # every collected case, classified
    counts(outcomes)                             # status -> how many cases
"""
from .cases import CaseInfo, case_info, case_named, cases_for, node_cases, tolerances
from .compare import compare
from .runner import CaseOutcome, EngineExecutor, Executor, run_case, run_suite, select_cases
from .status import ERROR, MISMATCH, PASS, UNSUPPORTED_OP, UNSUPPORTED_TYPE
from .status import FORWARD_STATUSES as STATUSES

__all__ = [
    "CaseInfo", "case_info", "case_named", "cases_for", "node_cases", "tolerances", "compare",
    "PASS", "MISMATCH", "UNSUPPORTED_OP", "UNSUPPORTED_TYPE", "ERROR", "STATUSES", "CaseOutcome",
    "EngineExecutor", "Executor", "run_case", "run_suite", "select_cases",
]
