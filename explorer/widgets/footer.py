"""The key footer: the main screen's keys as one line of text, drawn by one widget of fixed size.

A key appearing, leaving or turning dim repaints that one row and never lays out the screen
(docs/benchmarks.md has what Textual's Footer, a widget per key, cost). On a narrow terminal the
least needed keys leave the row (they stay in the help screen and the command palette) instead of
the row being cut mid-word.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget

# Actions whose keys leave first, in this order; the selection keys, feed, run, verify, step,
# export and quit stay to the last.
DROP_ORDER = ("command_palette", "heat_source", "diff", "cycle_view", "toggle_dtype", "cycle_device", "next_tensor",
              "search", "help", "diff('where')", "clear_selection", "export", "cancel")
KEPT = len(DROP_ORDER)
SEPARATOR = "▏"  # before the command palette's key, at the right edge


@dataclass(frozen=True)
class FooterKey:
    """A key as the footer shows it: `display` and `description` drawn, `key` pressed on a click."""

    key: str
    action: str
    display: str
    description: str
    enabled: bool
    tooltip: str


@dataclass(frozen=True)
class FooterUnit:
    """What leaves the row together: a key with its description, or a group's keys and its label."""

    keys: tuple[FooterKey, ...]
    label: str  # the group's description; "" for a lone key (its own description is drawn)
    rank: int  # position in DROP_ORDER; KEPT for keys that never leave

    @property
    def width(self) -> int:
        if self.label:
            return sum(len(k.display) + 1 for k in self.keys) + len(self.label)
        key = self.keys[0]
        return len(key.display) + (1 + len(key.description) if key.description else 0)


def footer_units(screen: Screen) -> tuple[list[FooterUnit], FooterUnit | None]:
    """The row's units in binding order, and the command palette's key (drawn at the right edge)."""
    app = screen.app
    by_action: dict[str, tuple] = {}
    for _, binding, enabled, tooltip in screen.active_bindings.values():
        if binding.show and binding.action not in by_action:  # several keys for one action: the first
            by_action[binding.action] = (binding, enabled, tooltip)

    def key(binding, enabled, tooltip, description) -> FooterKey:
        return FooterKey(binding.key, binding.action, app.get_key_display(binding), description, enabled,
                         tooltip or "")

    def rank(actions) -> int:
        return min((DROP_ORDER.index(a) for a in actions if a in DROP_ORDER), default=KEPT)

    units, palette = [], None
    for group, members in groupby(by_action.values(), lambda m: m[0].group):
        members = list(members)
        if group is not None and len(members) > 1:
            keys = tuple(key(b, e, t or b.description, "") for b, e, t in members)
            units.append(FooterUnit(keys, group.description, rank(k.action for k in keys)))
            continue
        for b, e, t in members:
            units.append(FooterUnit((key(b, e, t, b.description),), "", rank([b.action])))
    if app.ENABLE_COMMAND_PALETTE and app.COMMAND_PALETTE_BINDING in screen.active_bindings:
        _, binding, enabled, _ = screen.active_bindings[app.COMMAND_PALETTE_BINDING]
        palette = FooterUnit((key(binding, enabled, binding.tooltip or binding.description, binding.description),),
                             "", rank([binding.action]))
        units = [u for u in units if u.keys[0].action != binding.action]
    return units, palette


def fit(units: list[FooterUnit], palette: FooterUnit | None, width: int) -> tuple[list[FooterUnit], bool]:
    """The units that fit `width` columns (one space between them), and whether the palette's key does."""
    def cost(u: FooterUnit) -> int:  # its columns and what separates it from the rest
        return u.width + 1 + (len(SEPARATOR) + 1 if u is palette else 0)

    candidates = units + ([palette] if palette else [])
    need = sum(cost(u) for u in candidates) - 1
    dropped: set[int] = set()
    for u in sorted(candidates, key=lambda u: u.rank):
        if need <= width or u.rank == KEPT:
            break
        need -= cost(u)
        dropped.add(id(u))
    return [u for u in units if id(u) not in dropped], palette is not None and id(palette) not in dropped


class FittingFooter(Widget, can_focus=False):
    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"footer-key--key", "footer-key--description", "footer-key--item",
                         "footer-key--hover", "footer--separator"}
    DEFAULT_CSS = """
    FittingFooter {
        dock: bottom;
        height: 1;
        width: 1fr;
        color: $footer-foreground;
        background: $footer-background;
        .footer-key--item { background: $footer-item-background; }
        .footer-key--key { color: $footer-key-foreground; background: $footer-key-background; text-style: bold; }
        .footer-key--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
        .footer-key--hover { color: $footer-key-foreground; background: $block-hover-background; }
        .footer--separator { color: $foreground 20%; }
    }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._units: list[FooterUnit] = []
        self._palette: FooterUnit | None = None
        self._spans: list[tuple[int, int, FooterKey]] = []  # columns of each drawn key, for the mouse
        self._hover: FooterKey | None = None

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self.bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def bindings_changed(self, screen: Screen) -> None:
        # Textual's Footer ignores changes while the terminal has no focus (the focused widget, and
        # with it the bindings, is gone until it comes back), so the row does not flicker.
        if not screen.app.app_focus or screen is not self.screen:
            return
        units, palette = footer_units(screen)
        if (units, palette) != (self._units, self._palette):
            self._units, self._palette = units, palette
            self.refresh()

    def shown(self) -> list[FooterKey]:
        """The keys drawn on the row as it is now, left to right."""
        return [key for _, _, key in self._spans]

    def render(self) -> Text:
        units, with_palette = fit(self._units, self._palette, self.size.width)
        style = self.get_component_rich_style
        item, key_style, description = (style("footer-key--item"), style("footer-key--key"),
                                         style("footer-key--description"))
        hover, dim = style("footer-key--hover"), Style(dim=True)
        line, spans = Text(no_wrap=True, overflow="crop"), []

        def draw(k: FooterKey, with_description: bool) -> None:
            start = len(line)
            base = item + (Style() if k.enabled else dim)
            over = hover if k is self._hover else Style()
            line.append(k.display, base + key_style + over)
            if with_description and k.description:
                line.append(" " + k.description, base + description + over)
            spans.append((start, len(line), k))

        for n, unit in enumerate(units):
            if n:
                line.append(" ")
            for i, k in enumerate(unit.keys):
                if i:
                    line.append(" ")
                draw(k, not unit.label)
            if unit.label:
                line.append(" " + unit.label, description)
        if with_palette:
            tail = len(SEPARATOR) + self._palette.width + 1  # Textual's footer left its last column free
            line.append(" " * max(1, self.size.width - len(line) - tail))
            line.append(SEPARATOR, style("footer--separator"))
            draw(self._palette.keys[0], True)
            line.append(" ")
        self._spans = spans
        return line

    def _key_at(self, x: int) -> FooterKey | None:
        return next((k for start, end, k in self._spans if start <= x < end), None)

    def on_mouse_move(self, event: events.MouseMove) -> None:
        key = self._key_at(event.x)
        if key is not self._hover:
            self._hover = key
            self.tooltip = (key.tooltip or None) if key else None
            self.refresh()

    def on_leave(self, event: events.Leave) -> None:
        if self._hover is not None:
            self._hover = None
            self.tooltip = None
            self.refresh()

    def on_mouse_down(self, event: events.MouseDown) -> None:
        key = self._key_at(event.x)
        if key is None:
            return
        if key.enabled:
            self.app.simulate_key(key.key)
        else:
            self.app.bell()
