"""CPU-time medians of functions taking turns, for benchmarks on a shared machine (bench_verify)."""
from __future__ import annotations

import gc
import statistics
import time

SAMPLE_S = 0.05
WALL: dict[str, float] = {}  # median wall seconds per call of each function last timed


def median_time(fn, runs: int) -> float:
    """Median CPU seconds of this process per call (see `interleaved`)."""
    return interleaved({"f": fn}, runs)["f"]


def interleaved(fns: dict, runs: int) -> dict:
    """Median CPU time per call of each function, the functions taking turns run by run.

    The machine is shared, so wall time swings with other people's jobs; with one torch thread
    the process's CPU time is the work itself, and taking turns exposes both sides to the same
    conditions. Wall times are kept too (WALL) for the record.

    Garbage is collected between samples, never inside one (one side's garbage must not land on
    the other side's clock), and a sample of a function under 0.5 s starts with one untimed call, then
    as many timed calls as fill about SAMPLE_S (timeit's autorange): right after gc.collect() the
    first call of a few milliseconds runs on cold caches and pages and costs 1-2 ms more, an
    artefact of the harness that would swamp both sides of a millisecond comparison.
    """
    reps, warm = {}, {}
    for k, fn in fns.items():
        fn()  # warm up: plans, imports, kernels
        t = time.perf_counter()
        fn()
        once = time.perf_counter() - t
        reps[k] = 1 if once >= SAMPLE_S else max(1, int(SAMPLE_S / max(once, 1e-6)))
        warm[k] = once < 0.5  # an untimed call after gc.collect() is cheap next to the sample
    cpu = {k: [] for k in fns}
    wall = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            gc.collect()
            if warm[k]:
                fn()
            gc.disable()
            c, t = time.process_time(), time.perf_counter()
            try:
                for _ in range(reps[k]):
                    fn()
            finally:
                cpu[k].append((time.process_time() - c) / reps[k])
                wall[k].append((time.perf_counter() - t) / reps[k])
                gc.enable()
    for k in fns:
        WALL[k] = statistics.median(wall[k])
    return {k: statistics.median(v) for k, v in cpu.items()}
