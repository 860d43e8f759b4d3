"""Fixtures for the explorer's tests: apps built by the same `make_app` the console script uses."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os

import onnx
import pytest

import engine
from engine import examples
from explorer.app import make_app

SIZE = (120, 40)
DENSENET = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_densenet121.onnx")
SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "sample_models")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests in a fresh event loop (no pytest-asyncio needed for Pilot tests)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        asyncio.run(pyfuncitem.obj(**{k: pyfuncitem.funcargs[k] for k in names}))
        return True
    return None


def sample(name: str) -> str:
    return os.path.abspath(os.path.join(SAMPLES, name))


def spec_app(**kwargs):
    """The explorer on the bundled spec example; handler bugs raise instead of becoming toasts."""
    app = make_app(**kwargs)
    app.raise_errors = True
    return app


async def settle(app, pilot) -> None:
    """Let every worker finish and every message be handled."""
    from textual.worker import WorkerCancelled, WorkerFailed

    for _ in range(3):
        try:
            await app.workers.wait_for_complete()
        except WorkerFailed:  # expected in tests of failures: the app reports it as a notification
            pass
        except WorkerCancelled:  # cancelled while we waited (the monkey cancels everything): done too
            pass
        for _ in range(100):  # what a worker handed over while a key was answered: it lands after
            if not getattr(app, "put_off", 0):
                break
            await pilot.pause(0.02)
        await pilot.pause()


async def started(app, pilot) -> None:
    """Wait until the first layout is drawn."""
    graph = app.query_one("#graph")
    for _ in range(400):
        if graph.canvas is not None:
            break
        await pilot.pause(0.02)
    await settle(app, pilot)


@contextlib.asynccontextmanager
async def opened(app, hook=None, size=SIZE, run: bool = False):
    """A Pilot on `app` with its first layout drawn (and its gradients computed when `run`)."""
    async with app.run_test(size=size, message_hook=hook) as pilot:
        await started(app, pilot)
        if run:
            await pilot.press("r")
            await settle(app, pilot)
        yield pilot


@pytest.fixture
def spec_model() -> engine.Model:
    return engine.load(examples.spec_conv_gemm())


@pytest.fixture
def recorded():
    """A message hook and the list it fills: tests assert on domain messages, not only text."""
    seen = []
    return seen, seen.append


def of_type(messages, cls):
    return [m for m in messages if isinstance(m, cls)]


def plain(static) -> str:
    """The text a Static shows, whatever Rich renderable it holds."""
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(static.content)
    return console.export_text()
