"""A footer that fits its row: on a narrow terminal the least needed keys leave it (they stay in
the help screen and the command palette) instead of the row being cut mid-word."""
from __future__ import annotations

from textual.screen import Screen
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
        self._composed_keys: tuple | None = None  # the shown keys the mounted FooterKeys were made for
        self._recompose_pending = False

    @staticmethod
    def _shown(screen: Screen) -> tuple[tuple, dict[tuple[str, str], bool]]:
        """(the shown keys in order, with what a FooterKey displays; whether each is enabled)."""
        shown = [(b, enabled, tooltip) for _, b, enabled, tooltip in screen.active_bindings.values() if b.show]
        keys = tuple((b.key, b.action, b.description, b.group, tooltip) for b, _, tooltip in shown)
        return keys, {(b.key, b.action): enabled for b, enabled, _ in shown}

    def compose(self):
        self._composed_keys = self._shown(self.screen)[0]
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        # Textual's Footer remounts every key on each change, and the styles and whole-screen layout
        # that follow cost ~50-100 ms of the main thread on GPT-2; `r` alone sent three changes (work
        # started, the cancel key appeared, the selection's keys), each its own remount, so the first
        # key pressed after it waited ~300 ms. Keys only enabled or disabled are updated in place,
        # and changes that arrive while a remount is pending join it (compose reads the bindings then).
        if not (screen.app.app_focus and self.is_attached and screen is self.screen):
            super().bindings_changed(screen)
            return
        self._bindings_ready = True
        keys, enabled = self._shown(screen)
        if keys == self._composed_keys and not self._recompose_pending:
            for key in self.query(FooterKey):
                off = not enabled.get((key.key, key.action), not key._disabled)
                if off != key._disabled:
                    key._disabled = off
                    key.set_class(off, "-disabled")
        elif not self._recompose_pending:
            self._recompose_pending = True
            self.call_after_refresh(self.recompose)

    async def recompose(self) -> None:
        self._recompose_pending = False
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
