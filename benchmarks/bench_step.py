"""Step mode on light_densenet121: key `s` to the first painted StepScreen frame, medians.

Budget (issue 10): step mode starts within 3 s. The peer, timed in the same process on the same
selection, is one `Model.gradient` call on a freshly loaded model (plan building included, as
step mode builds its own): the ratio says how many gradients' worth of time the user waits.
Also reported: press -> reverse pass complete (step mode is usable before that: the reverse
frames arrive in chunks while the forward frames are on screen), and the process CPU seconds
of both. Times come from the frames handed to the terminal driver (explorer.measure.FrameClock).

    python benchmarks/bench_step.py [--runs 5] [--threads 1] [--json benchmarks/results/step.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import write_json  # noqa: E402

from explorer.measure import FrameClock  # noqa: E402

BUDGET_S = 3.0
SIZE = (120, 40)
DEFAULT_MODEL = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                             "light_densenet121.onnx")
SELECTION = ("fc6_1", ["data_0"])


async def one_run(model_path: str) -> dict:
    from explorer.app import make_app
    from explorer.measure import time_start
    from explorer.screens.step import StepScreen

    shown: list[float] = []
    cpu_shown: list[float] = []
    original = StepScreen._show

    def show(screen):  # when the screen's first content is in its widgets
        original(screen)
        shown.append(time.perf_counter())
        cpu_shown.append(time.process_time())

    StepScreen._show = show
    try:
        app = make_app(model_path)
        clock = FrameClock()
        clock.install(app)
        async with app.run_test(size=SIZE) as pilot:
            await time_start(app, pilot, clock, time.perf_counter(), timeout=120)
            await app.workers.wait_for_complete()
            app.session.select(*SELECTION)
            app.selection_changed()
            await app.workers.wait_for_complete()
            await pilot.pause(0.3)
            c0, t0 = time.process_time(), time.perf_counter()
            await pilot.press("s")
            while not shown and time.perf_counter() - t0 < 300:
                await pilot.pause(0.005)
            await pilot.pause()
            painted = clock.first_after(shown[0]) or time.perf_counter()
            cpu_screen = cpu_shown[0] - c0  # process CPU (all threads) until the first frame was in place
            screen = app.screen
            while not getattr(screen.trace, "complete", True) and time.perf_counter() - t0 < 300:
                await pilot.pause(0.01)
            complete = time.perf_counter()
            cpu_complete = time.process_time() - c0
            frames = len(screen.trace.frames)
    finally:
        StepScreen._show = original
    return {"screen_painted_s": round(painted - t0, 3), "trace_complete_s": round(complete - t0, 3),
            "cpu_screen_s": round(cpu_screen, 3), "cpu_complete_s": round(cpu_complete, 3), "frames": frames}


def peer_run(model_path: str) -> dict:
    import engine

    model = engine.load(model_path)
    c0, t0 = time.process_time(), time.perf_counter()
    model.gradient(*SELECTION)
    return {"wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "step.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs, peers = [], []
    for _ in range(args.runs):  # paired: each run next to its peer, under the same load
        runs.append(asyncio.run(one_run(args.model)))
        peers.append(peer_run(args.model))
    med = statistics.median

    def stat(rows, key):
        return {"median": med(r[key] for r in rows), "all": [r[key] for r in rows]}

    painted = med(r["screen_painted_s"] for r in runs)
    peer = med(r["wall_s"] for r in peers)
    result = {
        "model": os.path.basename(args.model), "selection": {"y": SELECTION[0], "xs": SELECTION[1]},
        "runs": args.runs, "terminal": list(SIZE), "torch_threads": args.threads, "frames": runs[0]["frames"],
        "screen_painted_s": stat(runs, "screen_painted_s"), "trace_complete_s": stat(runs, "trace_complete_s"),
        "cpu_screen_s": stat(runs, "cpu_screen_s"), "cpu_complete_s": stat(runs, "cpu_complete_s"),
        "peer_model_gradient": {"wall_s": stat(peers, "wall_s"), "cpu_s": stat(peers, "cpu_s")},
        "ratios_to_peer": {
            "screen_painted": round(painted / max(peer, 1e-9), 2),
            "trace_complete": round(med(r["trace_complete_s"] for r in runs) / max(peer, 1e-9), 2),
            "cpu_screen": round(med(r["cpu_screen_s"] for r in runs) / max(med(r["cpu_s"] for r in peers), 1e-9), 2),
        },
        "budget_s": BUDGET_S, "within_budget": painted <= BUDGET_S,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m": round(os.getloadavg()[0], 2)},
    }
    write_json(args.json, result, indent=2)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
