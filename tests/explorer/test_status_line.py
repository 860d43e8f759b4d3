"""The status line draws work, progress and ETA as one line of text: no layout while work runs."""
from __future__ import annotations

import time

from textual.app import App

from explorer.widgets.status import StatusLine, clock, progress_bar


def test_progress_bar_and_clock():
    assert progress_bar(0.0, 4) == "    " and progress_bar(1.0, 4) == "━━━━"
    assert progress_bar(0.5, 4) == "━━  " and progress_bar(0.375, 4) == "━╸  "
    assert progress_bar(7.0, 3) == "━━━" and progress_bar(-1.0, 3) == "   "
    assert clock(0) == "0:00" and clock(61.4) == "1:01" and clock(3599.6) == "60:00"


class _Host(App):
    def compose(self):
        yield StatusLine(id="status")


async def test_work_progress_and_idle_are_one_line_without_a_layout():
    app = _Host()
    async with app.run_test(size=(100, 5)) as pilot:
        status = app.query_one(StatusLine)
        text = lambda: str(app.query_one("#status-text").content)  # noqa: E731
        await pilot.pause()
        layouts, refresh_layout = [], app.screen._refresh_layout
        app.screen._refresh_layout = lambda *a, **k: (layouts.append(1), refresh_layout(*a, **k))[1]
        status.busy("computing gradients")
        await pilot.pause(0.6)  # the counter ticks
        assert text().startswith("computing gradients…  0:0") and text().endswith("(esc cancels)")
        status._started = time.monotonic() - 8.0  # eight seconds in, half done: eight more to go
        status.progress("verifying", 5, 10, "elements")
        await pilot.pause()
        assert text().startswith("verifying: elements 5/10  ━━━━━━━━━━ ") and " 50%  0:08  ETA 0:08" in text()
        status.progress("verifying", 0, 10, "elements")
        await pilot.pause(0.6)  # nothing done yet: the time spent still moves, no ETA
        assert "   0%  0:0" in text() and "ETA" not in text()
        status.progress("verifying", 10, 10, "elements")
        assert "100%" in text() and "ETA" not in text()
        status.idle()
        await pilot.pause(0.6)
        assert text() == "ready"
        status.note("a note")
        assert text() == "a note"
        status.note(None)
        assert text() == "ready"
        await pilot.pause()
        assert layouts == [], "the status line re-ran the screen's layout"
