"""The explorer on light_densenet121 (1,746 nodes): first paint and key-press latency, medians.

Budgets: first paint <= 2 s, a key press answered (its last frame drawn) in <= 100 ms. With
`--blocks N` the model is the generated residual chain of tests/big_models.py (4N + 1 nodes;
2,500 blocks make the 10,001-node model of issue 10), loaded inside the timed start, with the
budgets of that issue: the graph drawn within 1 s, a key median of 50 ms. A big graph is drawn
first as the cursor's neighbourhood; `full_layout_s` is when the whole layout replaced it, and
keys are timed after that.
Times come from the frames handed to the terminal driver (explorer.measure.FrameClock), so
Pilot's own idle waits are not counted. The peer, timed in the same process, is a bare Textual
app (a Static and a Footer): its first paint and key press are what Textual itself costs here.

    python benchmarks/bench_explorer.py [--runs 5] [--json benchmarks/results/explorer.json]
    python benchmarks/bench_explorer.py --blocks 2500 --runs 3   # -> results/explorer_generated.json

With `--ready MODEL` (a real-size export, e.g. GPT-2 124M; see issue 18) each run is a fresh
process timing, from before the load: the graph drawn and the app ready (the navigator listed,
the whole layout done, the cursor's value shown), keys pressed while the start's background work
runs, and keys pressed while a gradient with respect to the biggest weight is computed and that
weight's value (tens of millions of elements) is summarized. Budgets: graph drawn 2 s, ready 5 s,
a key 50 ms. `--ready MODEL --one` is one such run, printed as JSON (what bench_scale calls).

    python benchmarks/bench_explorer.py --ready ~/.cache/onnxgrad-bench/scale/gpt2/gpt2.onnx --runs 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import write_json  # noqa: E402

from explorer.measure import FrameClock, key_latencies, key_latencies_busy, summary, time_ready, time_start  # noqa: E402

FIRST_PAINT_BUDGET_S = 2.0
KEY_BUDGET_S = 0.100
GENERATED_BUDGETS = {"graph_paint_s": 1.0, "key_s": 0.050}
SIZE = (120, 40)
DEFAULT_MODEL = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                             "light_densenet121.onnx")
GRAPH_KEYS = ["down"] * 12 + ["right", "left"] * 4 + ["up"] * 6
READY_BUDGETS = {"graph_paint_s": 2.0, "ready_s": 5.0, "key_s": 0.050}
LIST_KEYS = ["down"] * 10 + ["pagedown", "pageup"] * 2


async def one_run(open_app) -> dict:
    clock = FrameClock()
    t0, cpu0 = time.perf_counter(), time.process_time()
    app = open_app()
    clock.install(app)
    async with app.run_test(size=SIZE) as pilot:
        start = await time_start(app, pilot, clock, t0)
        # Big graphs are drawn first as the cursor's neighbourhood; keys are timed on the whole layout.
        while getattr(app, "local", None) is not None:
            await pilot.pause(0.01)
        full_layout = time.perf_counter() - t0
        await pilot.pause(0.3)
        c0 = time.process_time()
        graph = await key_latencies(pilot, clock, GRAPH_KEYS)
        app.query_one("#node-options").focus()
        listing = await key_latencies(pilot, clock, LIST_KEYS)
        cpu_per_key = (time.process_time() - c0) / (len(GRAPH_KEYS) + len(LIST_KEYS))
    return {"nodes": len(app.session.graph.nodes), "first_paint_s": start.first_paint_s,
            "graph_paint_s": start.graph_paint_s, "full_layout_s": round(full_layout, 4),
            "graph_paint_cpu_s": round(clock.graph_cpu - cpu0, 4) if clock.graph_cpu is not None else None,
            "graph_keys": graph, "list_keys": listing, "cpu_per_key_s": round(cpu_per_key, 4)}


async def peer_run() -> dict:
    from textual.app import App
    from textual.binding import Binding
    from textual.widgets import Footer, Static

    class Bare(App):
        BINDINGS = [Binding("down", "bump", "Bump", id="bare.bump")]

        def compose(self):
            yield Static("0", id="counter")
            yield Footer()

        def action_bump(self):
            counter = self.query_one("#counter", Static)
            counter.update(str(int(str(counter.content)) + 1))

    clock = FrameClock()
    t0 = time.perf_counter()
    app = Bare()
    clock.install(app, handler="action_bump")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first = (clock.first_after(t0) or time.perf_counter()) - t0
        keys = await key_latencies(pilot, clock, ["down"] * 20)
    return {"first_paint_s": round(first, 4), "keys": keys}


def app_factory(model_path: str, blocks: int):
    """A function opening the app (the model loaded inside it, as the console script does) and its name."""
    import engine
    from explorer.app import make_app

    if not blocks:
        return (lambda: make_app(model_path)), os.path.basename(model_path)
    from tests.big_models import residual_chain

    proto = residual_chain(blocks)  # generated once: building the proto is not the app's work
    name = f"residual_chain({blocks})"
    return (lambda: make_app(model=engine.load(proto), label=name)), name


def import_time() -> float:
    """Seconds to import the app in a fresh interpreter (torch dominates; not part of first paint)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import explorer.app"], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return round(time.perf_counter() - t, 3)


async def ready_run(model_path: str) -> dict:
    """One real-size run (see the module's docstring), the model loaded inside the timed start."""
    from engine.gradient.feeds import declared_shape
    from explorer.app import make_app

    clock = FrameClock()
    during: dict[str, list[float]] = {}
    memory: dict[str, dict] = {}

    def on_screen():  # what the keys below change: a key leaving all of it as it was has nothing to draw
        return app.cursor, app.query_one("#inspector-page").offset_y, app.query_one("#graph").scroll_offset

    async def keys_while_starting(pilot) -> None:
        memory["drawn"] = rss()  # before any key: what opening the model costs
        during["start"] = await key_latencies_busy(app, clock, ["down"] * 6 + ["up"] * 6, state=on_screen)

    memory["before"] = rss()
    t0, cpu0 = time.perf_counter(), time.process_time()
    app = make_app(model_path)
    clock.install(app)
    async with app.run_test(size=SIZE) as pilot:
        times = await time_ready(app, pilot, clock, t0, during=keys_while_starting, started_cpu=cpu0)
        while app._work_live("values") or app._values_timer is not None:
            await pilot.pause(0.05)
        memory["values"] = rss()  # the arrow keys above started a forward pass: its values and the weights it read
        s = app.session
        biggest = max(s.model.graph.initializers, key=lambda n: math.prod(declared_shape(s.model.graph, n)))
        s.select(s.model.outputs[0], [biggest], list(s.model.inputs))
        app.selection_changed()
        app.move_cursor(None, biggest)
        app.query_one("#graph").focus()
        app.action_run()
        t_run = time.perf_counter()
        await pilot.pause(0.05)
        busy = await key_latencies_busy(app, clock, ["shift+down", "shift+up"] * 6, state=on_screen)
        work_live = any(w.is_running for w in app.workers if w.group in ("gradient", "summary", "values"))
        while s.gradient is None and time.perf_counter() - t_run < 300:
            await pilot.pause(0.05)
        gradient_s = time.perf_counter() - t_run
        await pilot.pause(1.0)  # the gradient's summaries and the weight's on screen
        memory["after_gradient"] = rss()
    return {"nodes": len(app.session.graph.nodes), **{k: getattr(times, k) for k in times.__dataclass_fields__},
            "keys_while_starting": during.get("start", []), "keys_while_gradient": busy,
            "gradient_still_running_after_keys": work_live, "gradient_s": round(gradient_s, 3),
            "biggest_weight": biggest, "rss": memory, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def rss() -> dict[str, int]:
    """Resident bytes: anonymous (the process's own) and file-backed (mapped weights, shared with the page cache)."""
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if line.startswith(("RssAnon", "RssFile")))
    return {k.lower(): int(v.split()[0]) * 1024 for k, v in fields.items()}


def ready_main(args) -> int:
    if args.one:
        print(json.dumps(asyncio.run(ready_run(args.ready))))
        return 0
    runs = []
    for _ in range(args.runs):  # each in a fresh process: the load and its memory are the app's own
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--ready", args.ready, "--one"],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    med = statistics.median
    keys = [k for r in runs for k in r["keys_while_starting"] + r["keys_while_gradient"]]
    folder, stem = os.path.dirname(os.path.abspath(args.ready)), os.path.splitext(os.path.basename(args.ready))[0]
    data = [os.path.join(folder, f) for f in os.listdir(folder) if f.startswith(stem)]  # the model, its external data
    result = {"model": os.path.basename(args.ready), "bytes": sum(os.path.getsize(f) for f in data if os.path.isfile(f)),
              "nodes": runs[0]["nodes"], "runs": args.runs, "terminal": list(SIZE)}
    result["peak_rss_bytes"] = med(r["peak_rss_bytes"] for r in runs)
    result["rss"] = {when: {kind: med(r["rss"][when][kind] for r in runs) for kind in runs[0]["rss"][when]}
                     for when in runs[0]["rss"]}
    for k in ("graph_paint_s", "listed_s", "laid_out_s", "value_s", "ready_s", "ready_cpu_s", "gradient_s"):
        result[k] = {"median": med(r[k] for r in runs), "all": [r[k] for r in runs]}
    result["key_s"] = {"while_starting": summary([k for r in runs for k in r["keys_while_starting"]]),
                       "while_gradient": summary([k for r in runs for k in r["keys_while_gradient"]]),
                       "all_median": med(keys), "over_budget": sum(k > READY_BUDGETS["key_s"] for k in keys),
                       "each": {"while_starting": [r["keys_while_starting"] for r in runs],
                                "while_gradient": [r["keys_while_gradient"] for r in runs]}}
    result["budgets"] = READY_BUDGETS
    result["within_budget"] = {"graph_paint": result["graph_paint_s"]["median"] <= READY_BUDGETS["graph_paint_s"],
                               "ready": result["ready_s"]["median"] <= READY_BUDGETS["ready_s"],
                               "key": result["key_s"]["all_median"] <= READY_BUDGETS["key_s"]}
    result["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                         "load_avg_1m": round(os.getloadavg()[0], 2)}
    write_json(args.json or os.path.join(os.path.dirname(__file__), "results", "explorer_real.json"), result, indent=2)
    print(json.dumps(result, indent=1))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--blocks", type=int, default=0, help="the generated residual chain of this many blocks")
    p.add_argument("--json", default=None)
    p.add_argument("--ready", metavar="MODEL", help="a real-size model: times to graph drawn and ready, keys meanwhile")
    p.add_argument("--one", action="store_true", help="with --ready: one run in this process, as JSON")
    args = p.parse_args(argv)
    if args.ready:
        return ready_main(args)
    results = os.path.join(os.path.dirname(__file__), "results")
    args.json = args.json or os.path.join(results, "explorer_generated.json" if args.blocks else "explorer.json")
    open_app, name = app_factory(args.model, args.blocks)
    runs = [asyncio.run(one_run(open_app)) for _ in range(args.runs)]
    peers = [asyncio.run(peer_run()) for _ in range(args.runs)]
    med = statistics.median
    graph_keys = [k for r in runs for k in r["graph_keys"]]
    list_keys = [k for r in runs for k in r["list_keys"]]
    peer_keys = [k for r in peers for k in r["keys"]]
    first = med(r["first_paint_s"] for r in runs)
    graph_paint = med(r["graph_paint_s"] for r in runs)
    budgets = GENERATED_BUDGETS if args.blocks else {"first_paint_s": FIRST_PAINT_BUDGET_S, "key_s": KEY_BUDGET_S}
    key_median = med(graph_keys + list_keys)
    result = {
        "model": name, "nodes": runs[0]["nodes"], "runs": args.runs, "terminal": list(SIZE),
        "first_paint_s": {"median": first, "all": [r["first_paint_s"] for r in runs]},
        "graph_paint_s": {"median": graph_paint,
                          "all": [r["graph_paint_s"] for r in runs]},
        "full_layout_s": {"median": med(r["full_layout_s"] for r in runs), "all": [r["full_layout_s"] for r in runs]},
        # CPU seconds of the process (all threads) from the start to the graph's first frame: what
        # a loaded machine changes least.
        "graph_paint_cpu_s": {"median": med(r["graph_paint_cpu_s"] or 0.0 for r in runs),
                              "all": [r["graph_paint_cpu_s"] for r in runs]},
        "key_s": {"graph": summary(graph_keys), "list": summary(list_keys), "all_median": key_median},
        "cpu_per_key_s": med(r["cpu_per_key_s"] for r in runs),
        "peer_bare_textual": {"first_paint_s": med(r["first_paint_s"] for r in peers), "key_s": summary(peer_keys)},
        "import_s": import_time(),
        "budgets": budgets,
        "within_budget": {"first_paint": first <= budgets.get("first_paint_s", float("inf")),
                          "graph_paint": graph_paint <= budgets.get("graph_paint_s", float("inf")),
                          "key": key_median <= budgets["key_s"]},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m": round(os.getloadavg()[0], 2)},
    }
    result["ratios_to_peer"] = {
        "first_paint": round(first / max(result["peer_bare_textual"]["first_paint_s"], 1e-9), 2),
        "key": round(key_median / max(result["peer_bare_textual"]["key_s"]["median_s"], 1e-9), 2),
    }
    write_json(args.json, result, indent=2)
    print(json.dumps({k: result[k] for k in ("first_paint_s", "graph_paint_s", "graph_paint_cpu_s", "full_layout_s",
                                             "key_s", "cpu_per_key_s",
                                             "peer_bare_textual", "within_budget", "ratios_to_peer")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
