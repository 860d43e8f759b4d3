"""Text updates that cost a layout only when they can change a widget's size.

`Static.update` lays out the whole screen every time. Most updates here either change nothing
(the session redrawn after an unrelated change) or go to a widget whose size CSS fixes: those
only repaint.
"""
from __future__ import annotations

from textual.widgets import Static


def set_text(widget: Static, content) -> None:
    """`widget.update(content)`, skipped when it shows that already; without a layout when CSS fixes its size."""
    if widget.content == content:
        return
    fixed = all(d is not None and not d.is_auto for d in (widget.styles.width, widget.styles.height))
    widget.update(content, layout=not fixed)
