"""Errors become notifications: a class decorator for every action and message handler.

A bug in a handler would otherwise end the app with a traceback on screen. Tests set
`App.raise_errors = True` so that the same bug fails them loudly instead.
"""
from __future__ import annotations

import functools
import inspect
import traceback


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


class Cancelled(BaseException):
    """Raised at a pause point in the thread of a cancelled worker (foreground.py): its work stops
    there, as a cancelled thread would otherwise run to its end. A BaseException, so that no
    `except Exception` on the way keeps it from leaving; `releasing` ends the worker quietly."""


def release_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames `exc` (and what caused it) went through.

    A worker's error is kept by its Worker, whose frame is in the error's traceback: a cycle only
    the collector breaks, and the explorer's collector waits for quiet keys. Until then the frames
    held what the failed job was computing (under the monkey on GPT-2, a failed float64 values pass
    left 0.3-1.2 GB of a forward pass's values for hundreds of keys). The traceback stays."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def releasing(fn, *once):
    """`fn` whose error, on its way out, no longer holds what its frames held (`release_frames`).

    `once`: arguments the call takes and lets go of when it ends. A Worker and its asyncio Task are
    a cycle (the Task's context holds the worker as `active_worker`), and the Worker keeps the
    callable it ran: a job given to it as a bound argument (a values pass with its feeds, 0.15 GB for
    a random feed of GPT-2's embedding) stayed until the next collection."""
    box = [once]

    @functools.wraps(fn)
    def run(*args, **kwargs):
        args = (*box.pop(), *args) if box else args
        try:
            return fn(*args, **kwargs)
        except Cancelled:
            return None  # nobody waits for what it would have posted
        except BaseException as exc:
            release_frames(exc)
            raise
        finally:
            del args
    return run


# Every background job: a thread, one at a time per group, a failure posted (Worker.StateChanged), never raised.
WORKER = {"thread": True, "exclusive": True, "exit_on_error": False}


def in_background(group: str):
    """`@work` for a thread worker of `group`: one at a time, a failure posted, never raised.

    The description is the group's name: by default Textual describes a worker by the repr of
    its arguments, and the repr of a model's graph index prints every weight (143 s before the
    navigator of GPT-2 124M was listed, on the UI thread).
    """
    from textual import work

    def decorate(fn):
        return work(group=group, description=group, **WORKER)(releasing(fn))
    return decorate
