"""The explorer's dialogs: modal screens that close once."""
from __future__ import annotations

from textual.await_complete import AwaitComplete
from textual.screen import ModalScreen


class Dialog(ModalScreen):
    """A modal screen whose second `dismiss` does nothing: two Enters in one burst (the second handled
    in the frame the first closed the dialog) dismissed it twice, and Textual's dismiss pops whatever
    screen is on top: with the main screen alone, ScreenStackError ended the app (found by the monkey
    on the feed and export dialogs; the palette has the same guard, explorer/commands.py)."""

    def dismiss(self, result=None) -> AwaitComplete:
        if not self.is_current:
            return AwaitComplete()
        return super().dismiss(result)
