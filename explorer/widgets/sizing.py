"""A scrolling widget's virtual size changed without laying out the whole screen.

Setting `virtual_size` makes Textual lay out every widget on the screen, then repaint them and
every scrollbar: on GPT-2 25-50 ms of the main thread for the navigator's listing arriving or
the whole graph replacing the cursor's neighbourhood, which a key pressed then waited for. Our
scrolling widgets get their box from CSS, never from their content, so a new virtual size only
moves their scrollbars: the screen is laid out again only when a scrollbar appears or goes.
"""
from __future__ import annotations

from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.widget import Widget


def set_virtual_size(view: ScrollView, size: Size) -> None:
    """`view.virtual_size = size`, with a layout only if it shows or hides a scrollbar."""
    if size == view.virtual_size:
        return
    if not view.container_size:  # not laid out yet: its first layout reads the size
        view.virtual_size = size
        return
    view.set_reactive(Widget.virtual_size, size)
    # What Textual's layout would do for this widget: decide the scrollbars (a change there is a
    # layout, through their reactives), size them, clamp the scroll offsets.
    view._scroll_update(size)
    view.refresh()
