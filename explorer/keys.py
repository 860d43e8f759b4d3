"""Which of the main screen's keys mean something now: the others leave the footer (they still
work from ctrl+p when they can)."""
from __future__ import annotations

from typing import Callable, Protocol

from textual.actions import parse
from textual.widgets import Input

from .host import Shown
from .state import available_devices

ALWAYS = ("quit", "help", "open_model", "command_palette")  # the keys left when no model could be opened


class KeysApp(Protocol):
    screen_stack: list  # the main screen is screen_stack[0]; more: a dialog or step mode is open
    focused: object


class Keys:
    """`bindings`: the main screen's. `cancellable()`: work that esc would cancel is running;
    `culprit()`: where n would go, else None."""

    def __init__(self, shown: Shown, app: KeysApp, bindings, cancellable: Callable[[], bool],
                 culprit: Callable[[], object]):
        self.shown, self.app, self.bindings = shown, app, list(bindings)
        self.cancellable, self.culprit = cancellable, culprit
        self.main_actions = frozenset(b.action.split("(")[0] for b in self.bindings)
        self._state: tuple = ()

    def applies(self, action: str, parameters: tuple = ()) -> bool | None:
        s, tensor = self.shown.session, self.shown.cursor[1]
        if len(self.app.screen_stack) > 1:
            # Step mode and dialogs own the keys while they are open: the main screen's keys stay off
            # behind them, Textual's own (tab and shift+tab between fields, ctrl+p, ctrl+q) stay on.
            return action == "quit" or action not in self.main_actions
        if s is None:
            return action in ALWAYS or None
        if action == "search":  # a "/" typed into a text field is a character
            return not isinstance(self.app.focused, Input)
        if action == "cancel":
            return self.cancellable()
        if action == "next_tensor":  # on a lone tensor it steps onto the node reading it
            return tensor is not None
        if action == "clear_selection":
            return bool(s.y or s.xs or s.zs)
        if action == "zs_inputs":
            return bool(s.missing_inputs)
        if action == "set_dims":
            return bool(s.dims_text())
        if action == "go_to_culprit":
            return self.culprit() is not None
        if action == "diff" and parameters[:1] in (("where",), ("leave",)):  # in diff mode only (b: always)
            return s.diff is not None
        if action == "cycle_device":
            return len(available_devices()) > 1
        if action == "heat_source":
            # On any tensor, not only once its heatmap is drawn: a key that came and went with each
            # value made the footer recompose twice per arrow press on big models.
            return tensor is not None
        return True

    def refresh(self, force: bool = False) -> None:
        """Announce the bindings only when a key appears, leaves or turns dim.

        `force` when work starts or ends: Textual also refreshes bindings by itself (a dialog
        closing), so the state cached here can be stale exactly then.
        """
        state = tuple(self.applies(*parse(b.action)[1:]) for b in self.bindings)
        if force or state != self._state:
            self._state = state
            # The main screen's footer, even while a dialog that is closing is still on top.
            self.app.screen_stack[0].refresh_bindings()
