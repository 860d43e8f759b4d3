"""A footer that fits its row: on a narrow terminal the least needed keys leave it (they stay in
the help screen and the command palette) instead of the row being cut mid-word."""
from __future__ import annotations

from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey, FooterLabel, KeyGroup

# Actions whose keys leave first, in this order; the selection keys, feed, run, verify, step,
# export and quit stay to the last.
DROP_ORDER = ("command_palette", "heat_source", "cycle_view", "toggle_dtype", "cycle_device", "next_tensor",
              "search", "help", "clear_selection", "export", "cancel")


class FittingFooter(Footer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._units: list[tuple[int, int, list[Widget]]] = []  # (drop rank, width, widgets)

    async def recompose(self) -> None:
        await super().recompose()
        self.call_after_refresh(self._measure)

    def on_resize(self) -> None:
        self._fit()

    def _measure(self) -> None:
        """Widths of the keys as laid out (all shown after a recompose), grouped as they go together."""
        units, children = [], list(self.children)
        for k, w in enumerate(children):
            if isinstance(w, FooterLabel):
                continue  # measured with the group before it
            widgets = [w]
            if isinstance(w, KeyGroup) and k + 1 < len(children) and isinstance(children[k + 1], FooterLabel):
                widgets.append(children[k + 1])
            actions = [key.action for key in (w.query(FooterKey) if isinstance(w, KeyGroup) else [w])]
            rank = min((DROP_ORDER.index(a) for a in actions if a in DROP_ORDER), default=len(DROP_ORDER))
            width = sum(x.outer_size.width + x.styles.margin.left + x.styles.margin.right for x in widgets)
            units.append((rank, width, widgets))
        self._units = units
        self._fit()

    def _fit(self) -> None:
        if not self._units:
            return
        room = self.size.width
        need = sum(width for _, width, _ in self._units)
        hidden = set()
        for rank, width, widgets in sorted(self._units, key=lambda u: u[0]):
            if need <= room or rank == len(DROP_ORDER):
                break
            need -= width
            hidden.update(id(w) for w in widgets)
        for _, _, widgets in self._units:
            for w in widgets:
                w.display = id(w) not in hidden
