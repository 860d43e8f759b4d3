"""SVG snapshots (pytest-textual-snapshot) of the main screen, the backward view, the verify table
(failing, and inconclusive with its advice) and step mode. Deterministic: float64, fixed seeds,
120x40, the pure-Python layered placement, no timings or paths on screen.

Update after an intended change with `pytest tests/explorer --snapshot-update` and review the SVGs.
"""
from __future__ import annotations

import pytest
from textual.widgets import Input

from engine.verify import CheckReport, Finding, NodeCheck, XCheck
from explorer.messages import CheckReady

from .conftest import SIZE, settle, spec_app, started


def _app():
    # Layered placement: Graphviz versions place boxes differently, and the snapshots must not care.
    return spec_app(dtype="float64", placement="layered")


async def _ready(pilot) -> None:
    await started(pilot.app, pilot)


async def _ran(pilot) -> None:
    await started(pilot.app, pilot)
    await pilot.press("r")
    await settle(pilot.app, pilot)


def test_main_screen(snap_compare):
    assert snap_compare(_app(), press=["down"], terminal_size=SIZE, run_before=_ran)


def test_backward_view(snap_compare):
    async def backward(pilot):
        await _ran(pilot)
        await pilot.press("g")
        await settle(pilot.app, pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=backward)


def _fixed_report() -> CheckReport:
    """A report with fixed numbers: the table's look, not the machine's rounding, is under test."""
    def x(name, status, err, index, a, n):
        return XCheck(name=name, status=status, max_abs_err=err, max_rel_err=err * 10, worst_index=index,
                      analytic=a, numeric=n, fd_error=1e-12, checked=18, failed=int(status == "fail"),
                      inconclusive=0)

    def node(name, op, status, err):
        return NodeCheck(node_name=name, op_type=op, status=status, max_abs_err=err, max_rel_err=err * 10,
                         reason=f"{name}: {status}", worst_input="H" if op == "Gemm" else "W", worst_index=(0, 1))

    # Rows after the verdicts, worst first: the failing conv, the finding, then the passing gemm.
    return CheckReport(ok=False, verdict="fail", mode="full", auto=True, seed=0, order=1,
                       results=(x("W", "fail", 0.25, (1, 0, 2, 2), 1.5, 1.25), x("Z", "pass", 2e-9, (3, 1), 0.07, 0.07)),
                       nodes=(node("gemm", "Gemm", "pass", 1e-9), node("conv", "Conv", "fail", 0.25)),
                       findings=(Finding("native-precision", "the float32 gradient of 'W' differs", x="W"),),
                       first_failing_node="conv", y="Y", xs=("W", "Z"), zs=("X",))


def test_verify_table(snap_compare):
    async def verified(pilot):
        await _ready(pilot)
        app = pilot.app
        app.session.accept_check(app.session.generation, _fixed_report())
        app.post_message(CheckReady(app.session.generation, app.session.check))
        await settle(app, pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=verified)


def _inconclusive_report() -> CheckReport:
    """W left inconclusive at a kink, with why and what would settle it; Z resolved by aligning dy."""
    w = XCheck(name="W", status="inconclusive", max_abs_err=3e-10, max_rel_err=2e-9, worst_index=(0, 0, 1, 1),
               analytic=0.5, numeric=0.5, fd_error=1e-9, checked=3, failed=0, inconclusive=1, kind="directions",
               reason="direction 0: not differentiable here: one-sided derivatives 0.2 (left) and 0.9 (right) "
                      "disagree, also at half the step (a kink such as Relu/Abs at 0, a Max/Min tie or a Clip bound)",
               advice="the point sits on or near a kink or jump (Relu at 0, a Max tie, Floor): choose other feeds "
                      "(--feeds, or --seed for made-up ones), or see which node with --per-node")
    z = XCheck(name="Z", status="pass", max_abs_err=4e-10, max_rel_err=1e-8, worst_index=(1, 2), analytic=0.07,
               numeric=0.07, fd_error=1e-9, checked=3, failed=0, inconclusive=0, kind="directions",
               resolved_by="aligned dy", reason="1 of 2 directions were too coarse to resolve with the check's dy; "
                                                "compared again (aligned dy): pass")
    nodes = (NodeCheck(node_name="conv", op_type="Conv", status="inconclusive", max_abs_err=1e-10, max_rel_err=1e-9,
                       reason="input 'W': element [0, 0, 1, 1]: not differentiable here", worst_input="W",
                       worst_index=(0, 0, 1, 1)),
             NodeCheck(node_name="gemm", op_type="Gemm", status="pass", max_abs_err=1e-11, max_rel_err=1e-10,
                       worst_input="H", worst_index=(0, 1)))
    return CheckReport(ok=False, verdict="inconclusive", mode="fast", auto=True, seed=0, order=1, results=(w, z),
                       nodes=nodes, directions=1, y="Y", xs=("W", "Z"), zs=("X",))


def test_verify_inconclusive(snap_compare):
    async def verified(pilot):
        await _ready(pilot)
        app = pilot.app
        app.session.accept_check(app.session.generation, _inconclusive_report())
        app.post_message(CheckReady(app.session.generation, app.session.check))
        await settle(app, pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=verified)


def test_step_mode(snap_compare):
    async def stepping(pilot):
        await _ready(pilot)
        await pilot.press("s")
        await settle(pilot.app, pilot)
        await pilot.press("n", "n", "n")

    assert snap_compare(_app(), terminal_size=SIZE, run_before=stepping)


SIZES = {"80x24": (80, 24), "120x40": (120, 40), "200x50": (200, 50)}
SCREENS = {"main": [], "verify": ["v"], "feed": ["f"], "export": ["e"], "help": ["question_mark"],
           "combined": ["g", "g"]}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("screen", SCREENS)
def test_every_screen_at_every_size(snap_compare, screen, size):
    """What a user sees at 80x24, 120x40 and 200x50: panes share the width, dialogs fit, nothing is cut."""
    async def opened(pilot):
        await _ran(pilot)
        await pilot.press(*SCREENS[screen])
        await settle(pilot.app, pilot)
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False  # a blinking cursor would make the picture depend on timing
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=SIZES[size], run_before=opened)
