"""The verdicts a gradient check gives, shared by `check`, its report and the conformance sweeps
(engine/conformance/status.py adds the sweeps' own statuses)."""

PASS, FAIL, INCONCLUSIVE, SKIPPED, CANCELLED = "pass", "fail", "inconclusive", "skipped", "cancelled"
UNCHECKED = "unchecked"  # an item (element or direction) not measured: never an x's verdict
