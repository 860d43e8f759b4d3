"""Conformance: ONNX's own node test cases through the engine (forward), and every passing
differentiable case against finite differences (gradients).

    from engine.conformance import run_suite, summarize
    outcomes = run_suite()                       # every collected case, classified
    table = summarize(outcomes)                  # per op: passed / total, statuses
"""
from .cases import CaseInfo, case_info, case_named, cases_for, node_cases, tolerances
from .compare import compare
from .runner import (
                     ERROR,
                     MISMATCH,
                     PASS,
                     STATUSES,
                     UNSUPPORTED_OP,
                     UNSUPPORTED_TYPE,
                     CaseOutcome,
                     EngineExecutor,
                     Executor,
                     run_case,
                     run_suite,
                     select_cases,
)

__all__ = [
    "CaseInfo", "case_info", "case_named", "cases_for", "node_cases", "tolerances", "compare",
    "PASS", "MISMATCH", "UNSUPPORTED_OP", "UNSUPPORTED_TYPE", "ERROR", "STATUSES", "CaseOutcome",
    "EngineExecutor", "Executor", "run_case", "run_suite", "select_cases",
]
