"""Frame timing for the benchmark and the latency test: when did the screen show a key's effect?

Pilot's own waits (idle detection sleeps) would dominate a wall-clock measure of a key press, so
this records when each frame is handed to the terminal driver (`App._display`, which runs in
headless mode too) and when the app finished handling the key (`move_cursor` returned), and
reports key -> the first frame after the handling: the frame that shows it.
"""
from __future__ import annotations

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


def summary(latencies: list[float]) -> dict:
    s = sorted(latencies)
    return {"median_s": round(median(s), 4), "p90_s": round(s[int(0.9 * (len(s) - 1))], 4), "max_s": s[-1],
            "n": len(s)}
