"""What the App's collaborators share, and the part of Textual's App they may use.

`Shown` is the state on screen: the session and the cursor. Each collaborator names the App
services it calls in a `Protocol` of its own, built on `Ui`; the App provides them all, a test
gives a fake (tests/explorer/test_collaborators.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from .guard import WORKER, releasing
from .state import Session


@dataclass
class Shown:
    """The session on screen (None: no model could be opened) and the cursor: (node index, tensor)."""

    session: Session | None = None
    cursor: tuple[int | None, str | None] = (None, None)


class Notify(Protocol):
    def __call__(self, message: str, *, title: str = "", severity: str = "information",
                 timeout: float | None = None) -> None: ...


class Ui(Protocol):
    """Textual's App as a collaborator sees it: tell the user, post a message, open a screen, find a widget."""

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None) -> None: ...

    def post_message(self, message) -> bool: ...

    def push_screen(self, screen, callback: Callable | None = None): ...

    def query_one(self, selector): ...


def tensor_or_warn(shown: Shown, notify: Notify) -> str | None:
    """The tensor under the cursor, else None and a word on how to get to one."""
    tensor = shown.cursor[1]
    if tensor is None:
        notify("Move to a tensor first (arrows, or / to search).", severity="warning")
    return tensor


def status_line(app):
    """The main screen's status line, also while step mode or a dialog is on top of it."""
    return app.screen_stack[0].query_one("#status")


def in_thread(app, group: str, fn: Callable, *args):
    """`fn(*args)` in a thread worker of `app` in `group`, as `guard.in_background` starts one: one
    at a time, a failure posted as Worker.StateChanged (holding nothing the job's frames held),
    described by the group's name alone."""
    return app.run_worker(releasing(fn, *args), name=fn.__name__, group=group, description=group, **WORKER)
