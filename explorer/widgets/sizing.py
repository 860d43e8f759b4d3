"""Scrolling widgets whose virtual size changes without laying out the whole screen.

These widgets get their box from CSS, never from their content, so a new virtual size (the
navigator's listing arriving, the whole graph replacing the cursor's neighbourhood, the gradients'
table filling) only moves their scrollbars: the screen is laid out again only when a scrollbar
appears or goes (through Textual's own `show_*_scrollbar` reactives). docs/benchmarks.md has
what Textual's `virtual_size` cost.
"""
from __future__ import annotations

from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import DataTable


class FixedBox:
    """Mixed in before a ScrollView whose size CSS fixes (a height and width that are not auto)."""

    virtual_size = Reactive(Size(0, 0), layout=False)

    def watch_virtual_size(self, size: Size) -> None:
        if self.container_size:  # laid out already (else its first layout reads the size)
            # What Textual's layout would do for this widget: decide the scrollbars, size them,
            # clamp the scroll offsets.
            self._scroll_update(size)
        self.refresh()


class FixedBoxTable(FixedBox, DataTable):
    """A DataTable of fixed size (the results' tables): rows arriving repaint the table alone."""
