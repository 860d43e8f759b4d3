"""Helpers for users' own test suites.

    from engine.testing import assert_gradients_match
    def test_my_model_gradients():
        assert_gradients_match("model.onnx", y="loss", xs=["W1", "b1"], mode="fast")
"""
from __future__ import annotations

from .verify import CheckReport, check


class GradientMismatch(AssertionError):
    """Raised by assert_gradients_match; `.report` holds the full CheckReport."""

    def __init__(self, report: CheckReport):
        super().__init__(report.summary())
        self.report = report


def assert_gradients_match(model, y: str, xs, zs=(), feeds=None, dy=None, mode: str = "full", order: int = 1,
                           claimed=None, rtol: float | None = None, atol: float | None = None, seed: int = 0,
                           allow_inconclusive: bool = False, **options) -> CheckReport:
    """engine.check(...) with the same arguments; raises GradientMismatch unless the verdict is pass.

    An inconclusive verdict (e.g. a Relu at exactly 0) also raises unless `allow_inconclusive`.
    Returns the report when it passes.
    """
    report = check(model, y, xs, zs=zs, feeds=feeds, dy=dy, mode=mode, order=order, claimed=claimed,
                   rtol=rtol, atol=atol, seed=seed, **options)
    accepted = {"pass", "inconclusive"} if allow_inconclusive else {"pass"}
    if report.verdict not in accepted:
        raise GradientMismatch(report)
    return report
