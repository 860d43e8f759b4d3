"""The UI thread first: background threads wait at the engine's pause points while a key is answered."""
from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time

import engine
from engine.run import pacing
from explorer import foreground
from explorer.foreground import Foreground

from .conftest import opened, settle, spec_app


def paused_for(fg: Foreground, started: threading.Event | None = None) -> tuple[threading.Thread, list[float]]:
    """A background thread that reaches one pause point; the list gets how long it waited there."""
    waited: list[float] = []

    def work():
        if started is not None:
            started.wait()
        t = time.perf_counter()
        fg.pause()
        waited.append(time.perf_counter() - t)

    thread = threading.Thread(target=work)
    thread.start()
    return thread, waited


def test_a_background_thread_waits_while_busy_and_goes_on_at_end():
    fg = Foreground()
    fg.open()
    try:
        fg.begin()
        thread, waited = paused_for(fg)
        time.sleep(0.03)
        assert thread.is_alive()  # held at its pause point
        fg.end()
        thread.join(1)
        assert not thread.is_alive() and 0.02 < waited[0] < foreground.HOLD_S
        fg.pause()  # the UI thread itself never waits
        thread, waited = paused_for(fg)  # nor anyone once the answer is drawn
        thread.join(1)
        assert waited[0] < 0.01
    finally:
        fg.close()


def test_a_wait_is_capped_and_then_the_work_runs_free_for_a_while():
    fg = Foreground()
    fg.open()
    try:
        waited: list[float] = []

        def work():
            for _ in range(2):
                fg.begin()  # keys keep coming, with no frame between them: a held arrow key
                t = time.perf_counter()
                fg.pause()
                waited.append(time.perf_counter() - t)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(1)
        assert foreground.HOLD_S * 0.9 <= waited[0] < foreground.HOLD_S + 0.1
        assert waited[1] < 0.01  # within FREE_S of a capped wait: no second wait
    finally:
        fg.close()


def test_the_hook_the_collector_and_the_switch_interval_are_the_apps_only_while_it_runs():
    was_on, interval = gc.isenabled(), sys.getswitchinterval()
    fg = Foreground()
    assert gc.isenabled() == was_on and pacing._hook is None  # an app made but not running changes nothing
    fg.open()
    assert pacing._hook == fg.pause and not gc.isenabled() and sys.getswitchinterval() == foreground.SWITCH_S
    fg.close()
    assert pacing._hook is None and gc.isenabled() == was_on and sys.getswitchinterval() == interval
    fg.close()  # twice: nothing more
    assert gc.isenabled() == was_on


async def test_a_cursor_key_holds_background_work_until_its_frame():
    app = spec_app()
    events: list[tuple] = []
    async with opened(app) as pilot:
        await settle(app, pilot)
        fg = app.foreground
        assert pacing._hook == fg.pause and not gc.isenabled()
        begin, end = fg.begin, fg.end
        fg.begin = lambda: (events.append(("begin", app.cursor)), begin())
        fg.end = lambda: (events.append(("end", app.cursor)), end())
        start = app.cursor
        await pilot.press("down")
        await pilot.pause()
        assert app.cursor != start
        assert [e[0] for e in events] == ["begin", "end"]
        assert events[0][1] == start and events[1][1] == app.cursor  # ended once the move was shown
        assert not fg.busy
        fg.begin()
        thread, waited = paused_for(fg)
        await pilot.press("down")  # its action's frame ends the wait, long before the cap
        await pilot.pause()
        thread.join(1)
        assert waited and waited[0] < foreground.HOLD_S * 0.9
    assert pacing._hook is None and gc.isenabled()
    engine.pause_point()


async def test_a_key_that_changes_nothing_is_timed_to_its_handling_not_to_a_later_frame():
    from explorer.measure import FrameClock, key_latencies_busy

    app = spec_app()
    clock = FrameClock()
    clock.install(app)
    async with opened(app) as pilot:
        await settle(app, pilot)
        graph = app.query_one("#graph")
        graph.focus()
        await pilot.pause()
        for _ in range(4):  # to the top box: "up" from there moves nothing
            await pilot.press("up")
        await pilot.pause()

        def state():
            return app.cursor, graph.scroll_offset
        before = state()
        t = time.perf_counter()
        (latency,) = await key_latencies_busy(app, clock, ["up"], state=state, timeout=3.0)
        assert state() == before and latency < 0.5 and time.perf_counter() - t < 1.0
        (latency,) = await key_latencies_busy(app, clock, ["down"], state=state, timeout=3.0)
        assert state() != before and latency < 0.5  # a move: timed to the frame showing it


def test_input_that_runs_no_action_is_busy_for_hold_s_at_most():
    fg = Foreground()
    fg.open()
    try:
        fg.begin()  # a character typed into the search box: no action, so no end()
        assert fg.busy
        time.sleep(foreground.HOLD_S + 0.02)
        assert not fg.busy  # the collector may run again, and nobody waits
        thread, waited = paused_for(fg)
        thread.join(1)
        assert waited[0] < 0.01
    finally:
        fg.close()


async def test_one_time_work_a_worker_hands_over_waits_for_the_key_being_answered():
    app = spec_app()
    async with opened(app) as pilot:
        await settle(app, pilot)
        ran: list[bool] = []
        app.after_input(lambda: ran.append(True))
        assert ran == [True]  # nothing being answered: at once
        app.foreground.begin()
        app.after_input(lambda: ran.append(False))
        assert ran == [True] and app.put_off == 1  # put off while the key is answered: still to come
        app.foreground.end()
        for _ in range(50):
            if len(ran) == 2:
                break
            await pilot.pause(0.02)
        assert ran == [True, False] and app.put_off == 0


def background_pauses(fg: Foreground, stop: threading.Event) -> tuple[threading.Thread, list[tuple[float, float]]]:
    """A background thread reaching a pause point every millisecond until `stop`: (when, waited) each."""
    pauses: list[tuple[float, float]] = []

    def work():
        while not stop.is_set():
            t = time.perf_counter()
            fg.pause()
            pauses.append((t, time.perf_counter() - t))
            time.sleep(0.001)

    thread = threading.Thread(target=work)
    thread.start()
    return thread, pauses


async def test_background_work_gives_way_while_the_event_loop_is_kept_from_running():
    fg = Foreground()
    fg.open()  # in the app's event loop: the heartbeat runs while background threads work
    stop = threading.Event()
    thread, pauses = background_pauses(fg, stop)
    try:
        await asyncio.sleep(0.1)  # the loop runs freely: the beats keep up and (almost) nobody waits
        assert len(pauses) > 20 and sum(w > 0.002 for _, w in pauses) <= len(pauses) // 5
        blocked = time.perf_counter()
        time.sleep(0.06)  # the loop kept from running (a long frame, or the lock)
        await asyncio.sleep(0.05)
        # Past LATE_S the thread waited at its pause point until the loop beat again
        held = [w for t, w in pauses if blocked < t < blocked + 0.06]
        assert held and max(held) > 0.06 - foreground.LATE_S - foreground.BEAT_S - 0.01
        assert not [t for t, w in pauses if blocked + foreground.LATE_S + 0.01 < t + w < blocked + 0.055]
        after = [w for t, w in pauses if t > blocked + 0.07]  # and goes on freely once the loop runs
        assert after and sum(w > 0.002 for w in after) <= len(after) // 5
    finally:
        stop.set()
        thread.join(1)
    for _ in range(40):  # no pause point for ACTIVE_S: no more beats (an idle app does not wake up)
        await asyncio.sleep(foreground.ACTIVE_S / 2)
        if not fg._beating:
            break
    assert not fg._beating
    fg.close()


async def test_closing_releases_a_thread_waiting_for_a_beat():
    fg = Foreground()
    fg.open()
    stop = threading.Event()
    thread, pauses = background_pauses(fg, stop)
    await asyncio.sleep(0.02)
    time.sleep(0.03)  # the thread now waits for a beat the loop cannot give
    stop.set()
    fg.close()
    thread.join(1)
    assert not thread.is_alive()
    fg.pause()  # closed: no beat, no wait


async def test_a_cancelled_workers_thread_stops_at_its_next_pause_point():
    """Textual cancels a thread worker's task, not its thread: the work stops at a pause point."""
    from explorer.host import in_thread

    app = spec_app()
    went_on, ended = [], threading.Event()

    def job(steps):
        try:
            for _ in range(steps):
                time.sleep(0.002)
                engine.pause_point()
            went_on.append("to its end")
        finally:
            ended.set()

    async with opened(app) as pilot:
        await settle(app, pilot)
        worker = in_thread(app, "gradient", job, 2000)  # about 4 s uncancelled
        await pilot.pause(0.05)
        worker.cancel()
        for _ in range(100):
            if ended.is_set():
                break
            await pilot.pause(0.01)
        assert ended.is_set() and not went_on
        done = in_thread(app, "gradient", job, 3)  # a worker not cancelled runs to its end
        await done.wait()
        assert went_on == ["to its end"]
