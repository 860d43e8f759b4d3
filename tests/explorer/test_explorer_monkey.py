"""A seeded monkey: 1,000 random keys per model must raise nothing and leave the app answering.

Keys come from every binding the app and its screens declare, plus printable characters, Tab,
Escape, Enter and the arrows, on three models: the bundled spec example, the biggest sample model
and a generated 401-node residual chain (past the layered-layout threshold). `raise_errors` makes
a bug in any handler fail the test instead of becoming a notification. Quitting keys are left out
(the app would end), and the test runs in a temporary directory so exports land there.

Keys go to the driver in bursts of one to eight, as a fast typist's would, with a short pause
between bursts: Pilot's `press` waits for the process to idle after every key, which never
happens while a worker computes, and would stretch 3,000 keys to minutes.
"""
from __future__ import annotations

import random
import string

import pytest
from textual import events
from textual.keys import _character_to_key

import engine
from explorer.app import ExplorerApp, make_app
from explorer.screens.dims import DimsScreen
from explorer.screens.export import ExportScreen
from explorer.screens.feed import FeedScreen
from explorer.screens.help import HelpScreen
from explorer.screens.prompt import PromptScreen
from explorer.screens.step import StepScreen
from explorer.screens.verify import VerifyScreen
from explorer.widgets.graph_view import GraphView
from explorer.widgets.node_list import EntryList, NodeList

from ..big_models import residual_chain
from .conftest import SIZE, sample, settle

KEYS_PER_MODEL = 1000
QUITTING = {"q", "ctrl+q", "ctrl+c"}


def key_pool() -> list[str]:
    owners = (ExplorerApp, GraphView, EntryList, NodeList, StepScreen, VerifyScreen, FeedScreen, ExportScreen,
              HelpScreen, PromptScreen, DimsScreen)
    bound = {key.strip() for cls in owners for b in cls.BINDINGS for key in b.key.split(",")}
    printable = set(string.ascii_letters + string.digits + "._-/:,=")
    named = {"tab", "shift+tab", "escape", "enter", "up", "down", "left", "right", "ctrl+p", "space", "backspace"}
    return sorted((bound | printable | named) - QUITTING)


MODELS = {
    "spec example": lambda: make_app(),
    "transformer_block sample": lambda: make_app(sample("transformer_block.onnx")),
    "residual chain, 401 nodes": lambda: make_app(model=engine.load(residual_chain(100)), label="chain"),
}


def key_event(key: str) -> events.Key:
    if len(key) == 1:
        return events.Key(key if key.isalnum() else _character_to_key(key), key)
    return events.Key(key, {"space": " ", "tab": "\t", "enter": "\r", "escape": "\x1b"}.get(key))


async def mash(pilot, keys) -> None:
    for key in keys:
        pilot.app._driver.send_message(key_event(key))
    await pilot.pause(0.01)


@pytest.mark.parametrize("name", list(MODELS))
async def test_random_keys_raise_nothing_and_the_app_still_answers(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(f"monkey:{name}")
    pool = key_pool()
    sent, quits = 0, 0
    while True:  # the palette's "Quit" can come up among the hits of random typing: start again
        app = MODELS[name]()
        app.raise_errors = True
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            while sent < KEYS_PER_MODEL and app.is_running:
                burst = [rng.choice(pool) for _ in range(min(rng.randint(1, 8), KEYS_PER_MODEL - sent))]
                await mash(pilot, burst)
                sent += len(burst)
            quit_early = not app.is_running
            if not quit_early:
                await check_still_answering(app, pilot)
        assert app._exception is None, f"after {sent} keys"
        if not quit_early:
            break
        assert app.return_code in (None, 0), f"after {sent} keys"
        quits += 1
        assert quits <= 3, "the app quit more often than random typing in the palette explains"


async def check_still_answering(app, pilot) -> None:
    for worker in app.workers:
        worker.cancel()
    await settle(app, pilot)
    while len(app.screen_stack) > 1:  # whatever dialog is open closes with Escape
        await pilot.press("escape")
        await pilot.pause()
    assert app.is_running and len(app.screen_stack) == 1
    before = app.session.view
    app.query_one("#graph").focus()
    await pilot.press("g")
    await pilot.pause()
    assert app.session.view != before  # still answering keys
