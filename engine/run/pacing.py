"""Pause points: where long pure-Python work lets an interactive front end go first.

A thread running Python holds the interpreter lock for up to `sys.getswitchinterval()` (5 ms) at a
time, and the lock goes to whichever waiting thread the OS wakes, not to the one that waited
longest. With two or three such threads busy (a layout, a model's forward pass, a label fit), a
UI thread answering a key waited 30-150 ms for its ~20 ms of work (docs/benchmarks.md). The engine's
long loops call `pause_point()` between small units of work (a layer of a layout, a step of a plan);
a front end installs a hook that blocks there while its UI thread is busy, and the work goes on
when the hook returns. With no hook installed (the default, and everything outside the explorer) a
pause point is one global read.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

_hook: Callable[[], None] | None = None


def set_pause_hook(hook: Callable[[], None] | None) -> Callable[[], None] | None:
    """Install `hook` (None: none), called at every pause point in any thread; returns the one before."""
    global _hook
    before, _hook = _hook, hook
    return before


def pause_point() -> None:
    hook = _hook
    if hook is not None:
        hook()


def paced(items: Iterable[T], every: int = 256) -> Iterator[T]:
    """`items`, with a pause point before the first and then every `every`-th one."""
    for k, item in enumerate(items):
        if not k % every:
            pause_point()
        yield item
