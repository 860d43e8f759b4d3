"""A seeded, weighted monkey for the explorer: random keys that make the app do its expensive work.

Uniform keys over every binding mostly move the cursor: on a 2,311-node model a run, a check or step
mode rarely gets a valid selection to work on. Here keys are drawn by weight from the bindings of
whatever screen is on top (the main screen: run, verify, step, views, cancel, feeds, dims, diff
weighted up; a dialog: enter, tab, escape, typing; step mode: its own keys), and now and then a
macro types what a user would: `/logits` enter `y`, `/` a weight enter `x`, `i`; `D` and a sequence
length; `f` on an input and a feed spec. After a key the monkey sometimes waits for the workers
(up to `settle_s`, so runs and checks finish), often pauses briefly, and otherwise goes straight on
(so escape cancels work under way).

A crash is the app ending with an exception (`raise_errors` turns a handler's bug into one) or a
worker failing with an error that is not an OnnxGradError. After a crash, or a quit typed through
the palette, a fresh app goes on with the remaining keys, in the same process.

Used by tests/explorer/test_explorer_monkey.py (a few hundred keys on a sample) and
benchmarks/monkey_explorer.py (10,000 keys on GPT-2 124M).
"""
from __future__ import annotations

import random
import string
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from textual import events
from textual.keys import _character_to_key
from textual.notifications import Notify
from textual.worker import Worker, WorkerState

from engine.errors import OnnxGradError
from explorer.screens.step import StepScreen

MAIN_WEIGHTS = {
    "r": 6, "v": 3, "s": 3, "g": 3, "escape": 6, "f": 2, "b": 1, "D": 1, "t": 1.5, "e": 0.5, "n": 1, "h": 1,
    "B": 0.5, "y": 2, "x": 2, "z": 1, "i": 1, "c": 0.5, "o": 2, "up": 3, "down": 3, "left": 3, "right": 3,
    "shift+up": 0.5, "shift+down": 0.5, "shift+left": 0.5, "shift+right": 0.5, "tab": 1, "shift+tab": 0.5,
    "slash": 1, "pageup": 0.3, "pagedown": 0.3, "home": 0.3, "end": 0.3, "enter": 1, "question_mark": 0.3,
    "ctrl+p": 0.2, "space": 0.3, "backspace": 0.3,
}
DIALOG_WEIGHTS = {"enter": 6, "escape": 2, "tab": 3, "shift+tab": 1, "space": 2, "up": 0.5, "down": 0.5,
                  "left": 1, "right": 1, "backspace": 1}
STEP_WEIGHTS = {"right": 4, "n": 2, "space": 2, "left": 2, "p": 1, "home": 1, "end": 1.5, "up": 0.5, "down": 0.5,
                "shift+up": 0.3, "shift+down": 0.3, "shift+left": 0.3, "shift+right": 0.3, "escape": 1.5, "q": 0.5}
PRINTABLE = string.ascii_letters + string.digits + "._-/:,="
TYPED_WEIGHT = 0.08  # each printable character, in a dialog or on the main screen
FEED_SPECS = ("zeros", "ones", "random:3", "0.5", "random")
QUITTING = {"q", "ctrl+q", "ctrl+c"}  # on the main screen (step mode's q closes step mode)
BREATH = "(pause)"  # in a macro: a short pause, as a typist's, where the app answers in a message of its own
NAMED = {"space": " ", "tab": "\t", "enter": "\r", "escape": "\x1b", "slash": "/", "question_mark": "?",
         "backspace": "\x7f"}


@dataclass(frozen=True)
class Targets:
    """Tensors the macros type: y candidates, x candidates, inputs to feed, symbolic dims' sizes."""

    ys: tuple[str, ...]
    xs: tuple[str, ...]
    feeds: tuple[str, ...] = ()
    dim_sizes: tuple[int, ...] = ()


@dataclass
class Tally:
    keys: int = 0
    macros: Counter = field(default_factory=Counter)
    sent: Counter = field(default_factory=Counter)
    notifications: Counter = field(default_factory=Counter)  # (severity, title)
    worker_errors: Counter = field(default_factory=Counter)  # OnnxGradError lines: refusals, not crashes
    crashes: list = field(default_factory=list)  # (keys so far, what)
    quits: int = 0
    apps: int = 0
    settles: int = 0
    settle_timeouts: int = 0
    finished: Counter = field(default_factory=Counter)  # results accepted: gradient, check, step frames

    def as_dict(self) -> dict:
        return {"keys": self.keys, "crashes": len(self.crashes), "crash_details": self.crashes[:20],
                "quits": self.quits, "apps": self.apps, "settles": self.settles,
                "settle_timeouts": self.settle_timeouts, "macros": dict(self.macros),
                "results": dict(self.finished),
                "notifications": {f"{sev}: {title}": n for (sev, title), n in self.notifications.most_common()},
                "worker_refusals": dict(self.worker_errors.most_common(30)),
                "keys_sent": dict(self.sent.most_common())}


def key_event(key: str) -> events.Key:
    if len(key) == 1:
        return events.Key(key if key.isalnum() else _character_to_key(key), key)
    return events.Key(key, NAMED.get(key))


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights) + list(PRINTABLE)
    w = list(weights.values()) + [TYPED_WEIGHT] * len(PRINTABLE)
    return rng.choices(keys, w)[0]


class Monkey:
    """`play(make_app, n)`: n keys over as many apps as crashes and quits need, counted in `tally`.

    `settle_p`: chance of waiting (up to `settle_s`) for the workers after a key; `pause_p`: of a short
    pause; `macro_p`: of a macro instead of a key on the main screen. `on_key(app, key)` runs after
    every key (the benchmark samples memory there)."""

    def __init__(self, targets: Targets, seed: int | str = 0, *, settle_p: float = 0.03, settle_s: float = 20.0,
                 pause_p: float = 0.3, macro_p: float = 0.03, size=(120, 40),
                 on_key: Callable | None = None):
        self.targets, self.rng = targets, random.Random(f"monkey:{seed}")
        self.settle_p, self.settle_s, self.pause_p, self.macro_p = settle_p, settle_s, pause_p, macro_p
        self.size, self.on_key = size, on_key
        self.tally = Tally()
        self.app = None

    async def play(self, make_app: Callable, n: int, finish: Callable | None = None) -> Tally:
        """`await finish(app, pilot)` after the last key, in the app that took it (if it still runs)."""
        while self.tally.keys < n:
            app = self.app = make_app()
            app.raise_errors = True
            self.tally.apps += 1
            try:
                async with app.run_test(size=self.size, message_hook=self._hook) as pilot:
                    await self._wait(app, pilot, 60.0)  # the first layout, listing and values
                    while self.tally.keys < n and app.is_running:
                        await self._one(app, pilot, n)
                    if finish is not None and app.is_running:
                        await finish(app, pilot)
            except Exception as exc:  # run_test re-raises what ended the app
                self._crash(exc)
                continue
            if app._exception is not None:
                self._crash(app._exception)
            elif self.tally.keys < n:
                self.tally.quits += 1
        return self.tally

    def _crash(self, exc: BaseException) -> None:
        where = "".join(traceback.format_exception(exc)[-3:])[-600:]
        self.tally.crashes.append((self.tally.keys, f"{type(exc).__name__}: {exc}"[:300], where))

    def _hook(self, message) -> None:
        t = self.tally
        if isinstance(message, Notify):
            t.notifications[(message.notification.severity, message.notification.title)] += 1
        elif isinstance(message, Worker.StateChanged) and message.state == WorkerState.ERROR:
            error = message.worker.error
            if isinstance(error, OnnxGradError):
                t.worker_errors[f"{message.worker.group}: {str(error)[:120]}"] += 1
            else:  # a bug shown as a notification: a crash for the monkey
                text = "".join(traceback.format_exception(error)[-3:])[-600:]
                t.crashes.append((t.keys, f"worker {message.worker.group}: {type(error).__name__}: {error}"[:300], text))
        elif type(message).__name__ in ("GradientReady", "CheckReady", "DiffReady", "TraceReady", "ExportDone"):
            t.finished[type(message).__name__] += 1

    async def _one(self, app, pilot, n: int) -> None:
        top = app.screen_stack[-1]
        if len(app.screen_stack) == 1 and self.rng.random() < self.macro_p:
            keys = self._macro()
        elif isinstance(top, StepScreen):
            keys = [_pick(self.rng, STEP_WEIGHTS)]
        elif len(app.screen_stack) > 1:
            keys = [_pick(self.rng, DIALOG_WEIGHTS)]
        else:
            keys = [_pick(self.rng, MAIN_WEIGHTS)]
        for key in keys:
            if key == BREATH:  # a search's Enter moves the cursor in a message of its own: let it land
                await pilot.pause(0.05)
                continue
            if self.tally.keys >= n:
                break
            if len(app.screen_stack) == 1 and key in QUITTING and not isinstance(app.focused, _input_types()):
                continue
            app._driver.send_message(key_event(key))
            self.tally.keys += 1
            self.tally.sent[key if len(key) > 1 or key in MAIN_WEIGHTS else "typed"] += 1
            await pilot.pause(0)
            if self.on_key is not None:
                self.on_key(app, key)
        roll = self.rng.random()
        if roll < self.settle_p:
            await self._wait(app, pilot, self.settle_s)
        elif roll < self.settle_p + self.pause_p:
            await pilot.pause(self.rng.choice((0.01, 0.03, 0.1)))

    def _macro(self) -> list[str]:
        t, rng = self.targets, self.rng
        choices = ["select", "select", "run", "verify", "step"]
        if t.feeds:
            choices.append("feed")
        if t.dim_sizes:
            choices.append("dims")
        kind = rng.choice(choices)
        self.tally.macros[kind] += 1
        if kind == "select":
            return (["slash", *rng.choice(t.ys), "enter", BREATH, "y", "slash", *rng.choice(t.xs), "enter", BREATH,
                     "x", "i"]
                    + (["escape"] if rng.random() < 0.5 else []))
        if kind == "run":
            return ["r"]
        if kind == "verify":
            return ["v", "enter"]
        if kind == "step":
            return ["s"]
        if kind == "feed":
            return ["slash", *rng.choice(t.feeds), "enter", BREATH, "f", *["backspace"] * 12, *rng.choice(FEED_SPECS), "enter"]
        return ["D", *["backspace"] * 4, *str(rng.choice(t.dim_sizes)), "enter"]

    async def _wait(self, app, pilot, limit: float) -> None:
        """Until no worker runs (or `limit` seconds), then what they posted is handled."""
        self.tally.settles += 1
        t0 = time.monotonic()
        while app.is_running and any(w.is_running for w in app.workers):
            if time.monotonic() - t0 > limit:
                self.tally.settle_timeouts += 1
                break
            await pilot.pause(0.05)
        if app.is_running:
            await pilot.pause(0.05)


def _input_types():
    from textual.widgets import Input

    return (Input,)
