"""Errors become notifications: a class decorator for every action and message handler.

A bug in a handler would otherwise end the app with a traceback on screen. Tests set
`App.raise_errors = True` so that the same bug fails them loudly instead.
"""
from __future__ import annotations

import functools
import inspect


def one_line(exc: BaseException) -> str:
    from engine.errors import OnnxGradError

    if isinstance(exc, OnnxGradError):
        return str(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _report(node, exc: Exception) -> None:
    app = node.app
    if getattr(app, "raise_errors", False):
        raise exc
    app.notify(one_line(exc), title="something went wrong", severity="error", timeout=12)


def _wrap(fn):
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def guarded_async(self, *args, **kwargs):
            try:
                return await fn(self, *args, **kwargs)
            except Exception as exc:
                _report(self, exc)
        return guarded_async

    @functools.wraps(fn)
    def guarded_sync(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            _report(self, exc)
    return guarded_sync


def guarded(cls):
    """Wrap every `action_*` and `on_*` method defined on `cls` (not inherited ones)."""
    for name, fn in list(vars(cls).items()):
        if (name.startswith("action_") or name.startswith("on_")) and inspect.isfunction(fn):
            setattr(cls, name, _wrap(fn))
    return cls


# Every background job: a thread, one at a time per group, a failure posted (Worker.StateChanged), never raised.
WORKER = {"thread": True, "exclusive": True, "exit_on_error": False}


def in_background(group: str):
    """`@work` for a thread worker of `group`: one at a time, a failure posted, never raised.

    The description is the group's name: by default Textual describes a worker by the repr of
    its arguments, and the repr of a model's graph index prints every weight (143 s before the
    navigator of GPT-2 124M was listed, on the UI thread).
    """
    from textual import work

    return work(group=group, description=group, **WORKER)
