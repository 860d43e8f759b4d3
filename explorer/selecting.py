"""The selection: y, xs and zs from the cursor, and the one key for the inputs zs lacks."""
from __future__ import annotations

from typing import Callable

from .host import Notify, Shown, tensor_or_warn


class Selection:
    """Changes the session's y, xs and zs. `changed()` follows every change (the App redraws and
    announces it); `notify` says why nothing changed."""

    def __init__(self, shown: Shown, notify: Notify, changed: Callable[[], None]):
        self.shown, self.notify, self.changed = shown, notify, changed

    def set_y(self) -> None:
        if (t := tensor_or_warn(self.shown, self.notify)) is not None:
            self.shown.session.set_y(t)
            self.changed()

    def toggle_x(self) -> None:
        if (t := tensor_or_warn(self.shown, self.notify)) is not None:
            self.shown.session.toggle_x(t)
            self.changed()

    def toggle_z(self) -> None:
        if (t := tensor_or_warn(self.shown, self.notify)) is not None:
            self.shown.session.toggle_z(t)
            self.changed()

    def zs_inputs(self) -> None:
        s = self.shown.session
        added = s.add_needed_inputs()
        if added:
            self.changed()
            self.notify(f"zs += {', '.join(added)}", timeout=3)
        else:
            self.notify("no graph input is missing from the selection" if s.y else "press y on a tensor first",
                        severity="warning", timeout=3)

    def clear(self) -> None:
        self.shown.session.clear_selection()
        self.changed()
