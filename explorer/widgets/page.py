"""A page of Rich text that scrolls itself, so new content never changes the screen's geometry.

The inspector's page: its content changes on every cursor move. The page keeps its size, wraps the
content at its width itself and scrolls by moving an offset, so new content repaints only its own
lines and never lays out the screen (docs/benchmarks.md: the inspector is a page).
"""
from __future__ import annotations

from rich.console import RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

TRACK, THUMB = "│", "┃"


class Page(Widget):
    DEFAULT_CSS = "Page { height: 1fr; }"

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.content: RenderableType = Text()
        self.offset_y = 0
        self._strips: list[Strip] = []
        self._blank = Strip([])
        self._width = -1
        self._base = Style()

    def show(self, content: RenderableType, *, keep_offset: bool) -> None:
        """Show `content`; from the top unless `keep_offset` (the same subject, updated)."""
        self.content = content
        self._width = -1  # wrap again on the next paint
        if not keep_offset:
            self.offset_y = 0
        self.refresh()

    @property
    def line_count(self) -> int:
        self._wrap()
        return len(self._strips)

    def scroll_lines(self, delta: int) -> None:
        top = max(0, min(self.offset_y + delta, self.line_count - self.size.height))
        if top != self.offset_y:
            self.offset_y = top
            self.refresh()

    def _text_width(self) -> int:
        return max(1, self.size.width - 1)  # the last column is the scroll indicator

    def _wrap(self) -> None:
        """Render the content to lines once per content and width (the paint reads them)."""
        width = self._text_width()
        if width != self._width:
            options = self.app.console.options.update_width(width)
            style = self.rich_style
            lines = self.app.console.render_lines(self.content, options, pad=True)
            self._strips = [Strip(line, width).apply_style(style) for line in lines]
            self._blank = Strip([Segment(" " * width, style)], width)
            self._base = style
            self._width = width
            self.offset_y = max(0, min(self.offset_y, len(self._strips) - self.size.height))

    def render_line(self, y: int) -> Strip:
        self._wrap()
        height = self.size.height
        k = self.offset_y + y
        text = self._strips[k] if k < len(self._strips) else self._blank
        return Strip.join([text, Strip([self._indicator(y, height)], 1)])

    def _indicator(self, y: int, height: int) -> Segment:
        total = len(self._strips)
        if total <= height or height <= 0:
            return Segment(" ", self._base)
        thumb = max(1, height * height // total)
        start = (height - thumb) * self.offset_y // max(1, total - height)
        inside = start <= y < start + thumb
        return Segment(THUMB if inside else TRACK, self._base + Style(dim=not inside))
