"""Input first, on the App's side: a key, click or wheel turn makes the app busy until the frame
after the action it ran (foreground.py), and one-time work handed over meanwhile waits for that frame."""
from __future__ import annotations

from typing import Callable

from textual import events

from . import messages as m
from .foreground import Foreground

AFTER_INPUT_S = 0.02  # how often work put off by after_input looks again
# Not pointer moves: background work waits while these are answered, until the frame after the
# action they ran, or at most foreground.HOLD_S (input that runs no action).
INPUT = (events.Key, events.MouseDown, events.MouseScrollUp, events.MouseScrollDown)


class Pacing:
    """`put_off` counts the callbacks held back on a timer: what a settled app (a test) waits for too."""

    def __init__(self, foreground: Foreground):
        self.foreground = foreground
        self.put_off = 0

    def saw(self, event: events.Event) -> None:
        if isinstance(event, INPUT) and not event.is_forwarded:
            self.foreground.begin()

    def action_ran(self, target) -> None:
        """`target` (the widget whose action ran, else the App) gets InputAnswered behind what the
        action posted, along the same path: when it reaches the App, the frame showing them is next."""
        if self.foreground.busy:
            target.post_message(m.InputAnswered())

    def after_input(self, owner, callback: Callable[[], None]) -> None:
        """`callback()` now, or once the input being answered is drawn: one-time work a worker hands
        over (a listing, the whole layout: 10-30 ms of the UI thread on GPT-2 large) would otherwise
        land inside that key's frame. `owner`'s timer looks again every AFTER_INPUT_S."""
        if self.foreground.busy:
            self.put_off_for(owner, AFTER_INPUT_S, lambda: self.after_input(owner, callback))
        else:
            callback()

    def put_off_for(self, owner, delay: float, callback: Callable[[], None]) -> None:
        """`callback()` after `delay` s, on `owner`'s timer, counted in `put_off` until then: work
        waiting for a timer is still under way, for whoever waits for the app to settle (a test)."""
        self.put_off += 1

        def run():
            self.put_off -= 1
            # The App's timers still fire while it shuts down, after its screens are gone: a listing or
            # labels handed over then would query widgets that no longer exist (found by the monkey).
            if owner.is_running:
                callback()
        owner.set_timer(delay, run)
