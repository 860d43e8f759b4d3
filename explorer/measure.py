"""Frame timing for the benchmark and the latency test: when did the screen show a key's effect?

Pilot's own waits (idle detection sleeps) would dominate a wall-clock measure of a key press, so
this records when each frame is handed to the terminal driver (`App._display`, which runs in
headless mode too) and when the app finished handling the key (`move_cursor` returned), and
reports key -> the first frame after the handling: the frame that shows it.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from statistics import median


@dataclass
class FrameClock:
    frames: list[float] = field(default_factory=list)
    handled: list[float] = field(default_factory=list)
    graph_frame: float | None = None  # the first frame handed over with a layout in the graph pane
    graph_cpu: float | None = None  # the process's CPU seconds (all threads) at that frame

    def install(self, app, handler: str = "move_cursor") -> None:
        """Record frames, and when `app.<handler>` (what a key ends in) returns."""
        original = app._display

        def display(screen, renderable):
            if renderable is not None:
                now = time.perf_counter()
                self.frames.append(now)
                if self.graph_frame is None and _graph_drawn(app):
                    self.graph_frame, self.graph_cpu = now, time.process_time()
            return original(screen, renderable)

        app._display = display
        handle = getattr(app, handler)

        def handled(*args, **kwargs):
            try:
                return handle(*args, **kwargs)
            finally:
                self.handled.append(time.perf_counter())

        setattr(app, handler, handled)
        run_action = app.run_action

        async def action_ran(*args, **kwargs):  # keys that move no cursor (pans, scrolls) end here
            try:
                return await run_action(*args, **kwargs)
            finally:
                self.handled.append(time.perf_counter())

        app.run_action = action_ran

    def first_after(self, t: float) -> float | None:
        return next((f for f in self.frames if f >= t), None)

    def last_between(self, t0: float, t1: float) -> float | None:
        inside = [f for f in self.frames if t0 <= f <= t1]
        return inside[-1] if inside else None


@dataclass(frozen=True)
class StartTimes:
    first_paint_s: float  # app start -> first frame
    graph_paint_s: float  # app start -> first frame with the graph drawn


def _graph_drawn(app) -> bool:
    """The main screen's graph pane holds a layout (the frame being handed over draws it)."""
    graphs = app.screen_stack[0].query("#graph") if app.screen_stack else ()
    return bool(graphs) and graphs.first().canvas is not None


async def time_start(app, pilot, clock: FrameClock, started: float, timeout: float = 30.0) -> StartTimes:
    """Wait for the graph to be drawn; the times of the first frame and of the graph's first frame."""
    deadline = time.perf_counter() + timeout
    while clock.graph_frame is None and time.perf_counter() < deadline:
        await pilot.pause(0.01)
    await pilot.pause()
    drawn = clock.graph_frame or time.perf_counter()
    first = clock.first_after(started)
    return StartTimes(round((first or drawn) - started, 4), round(drawn - started, 4))


async def key_latencies(pilot, clock: FrameClock, keys) -> list[float]:
    """Seconds from sending each key to the first frame drawn after the app handled it."""
    out = []
    for key in keys:
        t0 = time.perf_counter()
        await pilot.press(key)
        await pilot.pause()
        t1 = time.perf_counter()
        handled = [h for h in clock.handled if t0 <= h <= t1]
        shown = clock.first_after(handled[-1]) if handled else clock.last_between(t0, t1)
        out.append(round((shown if shown is not None and shown <= t1 else t1) - t0, 4))
    return out


async def key_latencies_busy(app, clock: FrameClock, keys, settle: float = 0.03, timeout: float = 10.0,
                             gap: float = 0.05, state=None) -> list[float]:
    """`key_latencies` for an app whose threads keep the CPU busy: Pilot's waits for an idle process
    would last their full second each, so each key goes straight to the driver, and its latency ends
    at the first frame after the last handling that followed it (no new handling for `settle` s).

    `state`, a callable returning what the keys change (the cursor, a scroll offset): a key that left
    it as it was (an arrow at the top of the graph) draws nothing, so its latency ends when it was
    handled; the first frame after that would be whatever background work drew next."""
    from textual import events

    out = []
    for key in keys:
        before = state() if state is not None else None
        t0 = time.perf_counter()
        event = events.Key(key, None)
        event.set_sender(app)
        app._driver.send_message(event)
        shown, quiet_since, last = None, None, None
        while time.perf_counter() - t0 < timeout:
            await asyncio.sleep(0.001)
            handled = [h for h in clock.handled if h >= t0]
            frame = clock.first_after(handled[-1]) if handled else None
            if frame != shown or (handled and handled[-1] != last):
                shown, last, quiet_since = frame, handled[-1], time.perf_counter()
            elif handled and time.perf_counter() - quiet_since >= settle:
                if shown is not None or (state is not None and state() == before):
                    break
        if shown is None and last is not None and state is not None and state() == before:
            shown = last  # answered, nothing to draw
        out.append(round((shown or time.perf_counter()) - t0, 4))
        await asyncio.sleep(gap)  # a fast typist's pace, not a flood
    return out


def summary(latencies: list[float]) -> dict:
    s = sorted(latencies)
    return {"median_s": round(median(s), 4), "p90_s": round(s[int(0.9 * (len(s) - 1))], 4), "max_s": s[-1],
            "n": len(s)}


@dataclass(frozen=True)
class ReadyTimes:
    """Seconds from the app's start: to the graph's first frame, and to each part of "ready"."""

    graph_paint_s: float
    listed_s: float  # the navigator lists every node
    laid_out_s: float  # the whole layout replaced the cursor's neighbourhood
    value_s: float  # the cursor's value is shown with its statistics
    ready_s: float  # the last of the three
    ready_cpu_s: float = 0.0  # CPU seconds of the process (all threads) from the start to ready


def ready_parts(app) -> dict[str, bool]:
    """Which parts of "ready" hold now (see ReadyTimes)."""
    s = app.session
    graph = app.query_one("#graph")
    tensor = app.cursor[1]
    value = s.values.get(tensor) if tensor is not None else None
    return {"listed": bool(app.query_one("#node-list").entries),
            "laid_out": app.local is None and graph.canvas is not None and app._layout_key() in app.layouts,
            "value": tensor is None or (value is not None and s.summaries.get("value", tensor, value) is not None)}


async def time_ready(app, pilot, clock: FrameClock, started: float, timeout: float = 120.0,
                     during=None, started_cpu: float | None = None) -> ReadyTimes:
    """Wait until the app is ready; `during(pilot)`, if given, is awaited once the graph is drawn
    (keys pressed while the listing, the layout and the values are still being made)."""
    seen: dict[str, float] = {}
    cpu0, cpu = time.process_time() if started_cpu is None else started_cpu, [0.0]

    async def watch() -> None:
        while len(seen) < 3:
            for part, done in ready_parts(app).items():
                if done and part not in seen:
                    seen[part] = time.perf_counter() - started
                    cpu[0] = time.process_time() - cpu0
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    deadline = time.perf_counter() + timeout
    while clock.graph_frame is None and time.perf_counter() < deadline:
        await pilot.pause(0.01)
    if during is not None:
        await during(pilot)
    while not watcher.done() and time.perf_counter() < deadline:
        await pilot.pause(0.01)
    watcher.cancel()
    never = round(time.perf_counter() - started, 4)
    parts = {k: round(seen.get(k, never), 4) for k in ("listed", "laid_out", "value")}
    drawn = round((clock.graph_frame or time.perf_counter()) - started, 4)
    return ReadyTimes(drawn, parts["listed"], parts["laid_out"], parts["value"], max(drawn, *parts.values()),
                      round(cpu[0], 4))
