"""Mixed into ExplorerApp: y, xs and zs from the cursor, and the one key for the inputs zs lacks."""
from __future__ import annotations

from . import messages as m
from .guard import guarded


@guarded
class Selecting:
    def _tensor_or_warn(self) -> str | None:
        tensor = self.cursor[1]
        if tensor is None:
            self.notify("Move to a tensor first (arrows, or / to search).", severity="warning")
        return tensor

    def action_set_y(self) -> None:
        if (t := self._tensor_or_warn()) is not None:
            self.session.set_y(t)
            self.selection_changed()

    def action_toggle_x(self) -> None:
        if (t := self._tensor_or_warn()) is not None:
            self.session.toggle_x(t)
            self.selection_changed()

    def action_toggle_z(self) -> None:
        if (t := self._tensor_or_warn()) is not None:
            self.session.toggle_z(t)
            self.selection_changed()

    def action_zs_inputs(self) -> None:
        added = self.session.add_needed_inputs()
        if added:
            self.selection_changed()
            self.notify(f"zs += {', '.join(added)}", timeout=3)
        else:
            self.notify("no graph input is missing from the selection" if self.session.y else "press y on a tensor first",
                        severity="warning", timeout=3)

    def action_clear_selection(self) -> None:
        self.session.clear_selection()
        self.selection_changed()

    def selection_changed(self) -> None:
        s = self.session
        self.results_changed()
        if s.view != "forward":
            self.request_layout()
        self.post_message(m.SelectionChanged(s.y, s.xs, s.zs, s.selection_error))
