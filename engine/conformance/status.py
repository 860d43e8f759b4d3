"""Every status the conformance sweeps report, each string defined once.

The strings appear in JSON reports, docs/ops.md, tests/*_floor.json and the tests: they never change.
A gradient check's verdicts (pass, fail, inconclusive, ...) are engine.verify's, re-exported here.
"""
from ..verify.status import CANCELLED, FAIL, INCONCLUSIVE, PASS, SKIPPED

# A gradient (or its finite differences) that is NaN or Inf: the gradient sweep's verdict beside the checker's.
NONFINITE = "non-finite"

# Forward: one node case through a backend (runner.py).
MISMATCH, UNSUPPORTED_OP, UNSUPPORTED_TYPE, ERROR = "mismatch", "unsupported op", "unsupported type", "error"
FORWARD_STATUSES = (PASS, MISMATCH, UNSUPPORTED_OP, UNSUPPORTED_TYPE, ERROR)
NO_ORACLE = "no oracle"  # a contrib case its oracle (onnxruntime) refuses: nothing to compare with (contrib.py)

# Gradients (gradients.py): the checker's verdicts, or why a case has nothing to check.
NOT_DIFFERENTIABLE, NOT_CHECKED = "not differentiable", "not checked"
GRADIENT_STATUSES = (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR, NOT_DIFFERENTIABLE, NOT_CHECKED)

# Forward mode (jvps.py): the gradient statuses, and an op the engine names as having no JVP (ForwardModeError).
NO_FORWARD_RULE = "no forward rule"
JVP_STATUSES = (PASS, INCONCLUSIVE, FAIL, NONFINITE, ERROR, NO_FORWARD_RULE, NOT_DIFFERENTIABLE, NOT_CHECKED)

# Lowering (lowered.py): the lowered gradient run by onnxruntime against the engine's.
LOWERED, WRONG, REFUSED, RUNTIME, NOT_APPLICABLE = "lowered", "wrong", "refused", "runtime lacks op", "not applicable"
LOWERING_STATUSES = (LOWERED, WRONG, REFUSED, ERROR, RUNTIME, NOT_APPLICABLE)

# An op's cell (docs/ops.md) when every case that did not pass is a documented one.
ONLY_DOCUMENTED = "documented"

# Mutation (mutation.py): what a check in one mode made of a wrong VJP.
KILLED, SURVIVED, UNSEEN = "killed", "survived", "unseen"
MUTANT_STATUSES = (KILLED, INCONCLUSIVE, SURVIVED, UNSEEN, ERROR)

_RANK = {PASS: 0, INCONCLUSIVE: 1, NONFINITE: 2, FAIL: 3}  # any other status ranks with PASS


def worse(a: str, b: str) -> str:
    """The worse of two gradient verdicts: fail > non-finite > inconclusive > pass (a tie keeps `a`)."""
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


__all__ = ["PASS", "FAIL", "INCONCLUSIVE", "SKIPPED", "CANCELLED", "NONFINITE", "MISMATCH", "UNSUPPORTED_OP",
           "UNSUPPORTED_TYPE", "ERROR", "FORWARD_STATUSES", "NO_ORACLE", "NOT_DIFFERENTIABLE", "NOT_CHECKED",
           "GRADIENT_STATUSES", "NO_FORWARD_RULE",
           "JVP_STATUSES", "LOWERED", "WRONG", "REFUSED", "RUNTIME", "NOT_APPLICABLE", "LOWERING_STATUSES",
           "ONLY_DOCUMENTED", "KILLED", "SURVIVED", "UNSEEN", "MUTANT_STATUSES", "worse"]
