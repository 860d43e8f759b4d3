"""The UI thread first: while a key is being answered, background work waits at the engine's pause points.

Python threads share one interpreter lock, handed to whichever waiting thread the OS wakes. With a
layout, a forward pass and a label fit running, an arrow key's ~20 ms of work waited 30-150 ms for
the lock (docs/benchmarks.md, "Background work waits for the keys"). So an input event marks the
app busy until the frame after the action it ran is drawn, and every background thread reaching
`engine.pause_point()` meanwhile sleeps (releasing the lock) until then, for at most `HOLD_S`.
A thread that waited the whole `HOLD_S` (keys arriving without a break: a held arrow key) then
runs `FREE_S` without stopping, so the work still moves. The cap also bounds the cost of a
thread paused while it holds something the UI thread needs: a delay of `HOLD_S`, never a deadlock.

Before the app sees a key, the UI thread (or the driver's input thread) already waits for the lock:
a pure-Python worker (the layout, the label fit) kept it from the event loop for 20-40 ms before
the key was even read, at 10% of one core. So while background work runs, the UI thread beats every
`BEAT_S` on its event loop, and a background thread that finds the last beat more than `LATE_S`
old waits at its pause point for the next one: the loop was kept from running, by the lock or by
its own work (a frame), and goes first.

The cyclic garbage collector stops the process too: a pass over a big model's young objects held
the lock for 15-65 ms, in whichever thread happened to allocate. While the app runs, automatic
collection is off and `collect` runs it from a timer, once the keys have been quiet for `QUIET_S`.
Garbage held that way can be big (a closed step mode's trace, a replaced check): once resident memory
has grown by `GROWTH` since the last full collection the next one is full, and hands the freed heap
back (allocator.py); grown by `URGENT`, it runs even while keys arrive (on GPT-2 124M, 500 random
keys left 0.6 GB of collectable garbage).

A pause point in the thread of a cancelled worker raises `guard.Cancelled`: Textual cancels a thread
worker's task, never its thread, and the work it leaves behind would otherwise run to its end.

`open` (the app mounted) installs all of it for the process: the pause hook, the collector's
state, a 1 ms switch interval; `close` (the app unmounted) puts back what was there.
"""
from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time

from textual.worker import NoActiveWorker, get_current_worker

import engine

from . import allocator
from .guard import Cancelled

HOLD_S = 0.1  # the longest a background thread waits for one answer (also: input that runs no action)
FREE_S = 0.05  # after waiting that long, how long it runs before waiting again
QUIET_S = 0.5  # no input for this long: the collector may run
SWITCH_S = 0.001  # the interpreter lock's hand-over interval (Python's default: 5 ms)
FULL_EVERY = 10  # every this many collections, a full one (the oldest generation too)
BEAT_S = 0.004  # the UI thread's heartbeat while background threads reach pause points
LATE_S = 0.008  # a beat this late: the event loop waits for the lock, or is busy; background work gives way
ACTIVE_S = 0.1  # the heartbeat stops this long after the last pause point
GROWTH = 64 << 20  # resident bytes grown since the last full collection: the next one is full
URGENT = 512 << 20  # grown this much: collect now, keys or not


class Foreground:
    def __init__(self):
        self._idle = threading.Event()
        self._idle.set()
        self._until = 0.0
        self._ui: int | None = None  # the thread that answers input: it never waits here
        self._free = threading.local()
        self._last_input = 0.0
        self._collections = 0
        self._before: tuple | None = None  # (pause hook, collector on, switch interval) while open
        self._loop: asyncio.AbstractEventLoop | None = None  # the UI thread's, for the heartbeat
        self._beating = False
        self._beat_at = 0.0  # the last beat
        self._beat = threading.Event()  # set by the next beat
        self._next_beat: asyncio.TimerHandle | None = None
        self._worked = 0.0  # the last pause point reached
        self._start_lock = threading.Lock()
        self._resident = 0  # resident bytes after the last full collection

    def open(self) -> None:
        """From the UI thread, once the app runs."""
        if self._before is not None:
            return
        self._ui = threading.get_ident()
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # opened outside an event loop (a test): no heartbeat
            self._loop = None
        self._before = (engine.set_pause_hook(self.pause), gc.isenabled(), sys.getswitchinterval())
        gc.disable()
        sys.setswitchinterval(SWITCH_S)
        allocator.hold_mmap_threshold()  # for the process, as the CLI does, and left so
        self._resident = allocator.resident_bytes()

    def close(self) -> None:
        """The app is closing: the process as it was, and no thread left waiting."""
        self.end()
        if self._before is None:
            return
        hook, collector_on, interval = self._before
        self._before = None
        if self._next_beat is not None:
            self._next_beat.cancel()
        self._loop, self._beating = None, False
        self._beat.set()
        engine.set_pause_hook(hook)
        # What the app froze (graph_work.py: the model and its first layout) is collectable again: a
        # process opening app after app (tests, the monkey after a crash) kept every model before.
        gc.unfreeze()
        if collector_on:
            gc.enable()
        sys.setswitchinterval(interval)

    @property
    def busy(self) -> bool:
        """Answering input: from `begin` until `end`, or `HOLD_S` at most (input that ran no action)."""
        return not self._idle.is_set() and time.monotonic() < self._until

    def begin(self) -> None:
        """An input event arrived: background work pauses until `end` (or for `HOLD_S`)."""
        self._last_input = time.monotonic()
        self._until = self._last_input + HOLD_S
        self._idle.clear()

    def end(self) -> None:
        self._idle.set()

    def pause(self) -> None:
        """The engine's pause hook: in a background thread, wait while the UI thread is busy
        answering input, or while its event loop is kept from running (a late beat)."""
        if threading.get_ident() == self._ui:
            return
        if _cancelled():
            # Under the monkey on GPT-2 a cancelled diff went on for 10 s, 1.2 GB more at its peak.
            raise Cancelled
        now = self._worked = time.monotonic()
        if not self._beating and self._loop is not None:
            self._start_beating()
        if now < getattr(self._free, "until", 0.0):
            return
        if not self._idle.is_set() and now < self._until:
            answered = self._idle.wait(self._until - now)
        elif self._beating and now - self._beat_at > LATE_S:
            answered = self._beat.wait(HOLD_S)
        else:
            return
        if not answered:
            self._free.until = time.monotonic() + FREE_S

    def _start_beating(self) -> None:
        with self._start_lock:
            loop = self._loop
            if self._beating or loop is None:
                return
            self._beat_at, self._beating = time.monotonic(), True
        try:
            loop.call_soon_threadsafe(self._tick)
        except RuntimeError:  # the loop closed meanwhile
            self._beating = False

    def _tick(self) -> None:
        """A beat, on the UI thread: waiting background threads go on; the next beat, while they work."""
        now = self._beat_at = time.monotonic()
        released, self._beat = self._beat, threading.Event()
        released.set()
        if self._loop is not None and now - self._worked < ACTIVE_S:
            self._next_beat = self._loop.call_later(BEAT_S, self._tick)
        else:
            self._next_beat, self._beating = None, False

    def collect(self) -> None:
        """The collector's pass, from a timer on the UI thread: when no input came for `QUIET_S`, or
        memory grew by `URGENT`; full every `FULL_EVERY` passes or after `GROWTH`."""
        grown = allocator.resident_bytes() - self._resident
        if grown < URGENT and (self.busy or time.monotonic() - self._last_input < QUIET_S):
            return
        self._collections += 1
        full = grown >= GROWTH or self._collections % FULL_EVERY == 0
        gc.collect(2 if full else 1)
        if full:
            allocator.trim()
            self._resident = allocator.resident_bytes()


def _cancelled() -> bool:
    """This thread runs a worker that was cancelled."""
    try:
        return get_current_worker().is_cancelled
    except NoActiveWorker:
        return False
