"""The verdicts a gradient check gives, shared by `check`, its report and the conformance sweeps."""

PASS, FAIL, INCONCLUSIVE, SKIPPED, CANCELLED = "pass", "fail", "inconclusive", "skipped", "cancelled"
