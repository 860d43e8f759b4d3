"""Terminal layout of light_densenet121 (1,746 nodes): Graphviz-based and pure-Python, budget 2 s each.

Each run lays the forward view out from scratch (the layout cache is cleared). The peer is the
Graphviz `dot -Tplain` call alone on the same graph, timed in the same process, so the ratio says
what our own code adds to it. Wall time on a shared machine counts other processes too, so the CPU
time (ours plus dot's, as a child process) is reported beside it, with the load average.

    python benchmarks/bench_layout.py [--runs 7] [--model PATH] [--json benchmarks/results/layout.json]
    python benchmarks/bench_layout.py --blocks 2500 --runs 3   # -> results/layout_generated.json
    python benchmarks/bench_layout.py --blocks 2500 --view both --no-peer   # both views, quick

`--blocks N` lays out the backward view (y = loss, xs = input) of the generated residual chain of
tests/big_models.py instead: 2,500 blocks make the 12,503-node view of issue 10 (budget 2 s);
`--view forward` or `both` takes its forward view too (10,003 nodes, what the explorer opens on).
Graphviz takes minutes on it, so the peer is then capped at PEER_CAP_S and the ratio is an
upper bound when dot hits the cap; `--no-peer` leaves it out.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import write_json  # noqa: E402

from engine.errors import OnnxGradError  # noqa: E402
from engine.gradient.selection import validate  # noqa: E402
from engine.graphs import layout as layout_module  # noqa: E402
from engine.graphs.terminal import Canvas  # noqa: E402
from engine.graphs.view import build_view  # noqa: E402
from engine.modelfile.reader import read_graph  # noqa: E402

BUDGET_S = 2.0
PEER_CAP_S = 60.0
DEFAULT_MODEL = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                             "light_densenet121.onnx")


def cpu_seconds() -> float:
    own, children = os.times()[0:2], os.times()[2:4]
    return sum(own) + sum(children)


def timed(fn, runs: int) -> tuple[list[float], list[float], object]:
    walls, cpus, result = [], [], None
    for _ in range(runs):
        layout_module._cache.clear()
        c0, t0 = cpu_seconds(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_seconds() - c0)
    return walls, cpus, result


def raw_dot(dot_text: bytes, cap: float | None = None):
    def run():
        try:
            subprocess.run(["dot", "-Tplain"], input=dot_text, capture_output=True, check=True, timeout=cap)
        except subprocess.TimeoutExpired:
            pass  # the wall time then reads as the cap: a lower bound for dot
    return run


def measure(graph, spec, view_name: str, engine: str, runs: int) -> dict:
    """The layout from scratch `runs` times, then its canvas index and a viewport repaint."""
    walls, cpus, laid = timed(lambda: layout_module.layout_graph(graph, spec, view_name, engine=engine), runs)
    canvas_walls, _, canvas = timed(lambda: Canvas(laid), 3)
    region_walls = []
    for k in range(30):
        t0 = time.perf_counter()
        canvas.region((k * 37) % max(laid.width - 160, 1), (k * 113) % max(laid.height - 50, 1), 160, 50)
        region_walls.append(time.perf_counter() - t0)
    return {
        "view_nodes": len(laid.nodes),
        "median_wall_s": statistics.median(walls), "min_wall_s": min(walls), "median_cpu_s": statistics.median(cpus),
        "under_budget": statistics.median(walls) < BUDGET_S, "width": laid.width, "height": laid.height,
        "canvas_index_s": statistics.median(canvas_walls), "viewport_160x50_ms": 1000 * statistics.median(region_walls),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--blocks", type=int, default=0, help="the generated residual chain's backward view")
    parser.add_argument("--view", choices=("backward", "forward", "both"), default="backward",
                        help="with --blocks: which view of the residual chain")
    parser.add_argument("--no-peer", action="store_true", help="skip the raw dot -Tplain peer")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = os.path.join(os.path.dirname(__file__), "results")
    args.json = args.json or os.path.join(results, "layout_generated.json" if args.blocks else "layout.json")

    if args.blocks:
        from tests.big_models import residual_chain

        graph, name = read_graph(residual_chain(args.blocks)), f"residual_chain({args.blocks})"
        spec = validate(graph, "loss", ["input"], [])
        views = ["backward", "forward"] if args.view == "both" else [args.view]
    else:
        graph, name, views, spec = read_graph(args.model), os.path.basename(args.model), ["forward"], None
    view = build_view(graph, spec if views[0] != "forward" else None, views[0], needs_edges=False)
    report = {
        "model": name, "view": " and ".join(views), "nodes": len(graph.nodes), "view_nodes": len(view.nodes),
        "runs": args.runs, "budget_s": BUDGET_S, "python": platform.python_version(),
        "cpus": os.cpu_count(), "load_average_before": os.getloadavg(), "engines": {},
    }
    engines = ["layered"] + (["dot"] if shutil.which("dot") else [])
    if "dot" in engines and not args.no_peer:  # the same DOT text layout.py hands to Graphviz, captured once
        captured = {}
        real_run = layout_module.subprocess.run

        def spy(cmd, input=None, **kw):
            captured["input"] = input
            return real_run(cmd, input=input, **kw)

        layout_module.subprocess.run = spy
        try:
            layout_module.layout_view(view, "dot")
        except OnnxGradError:
            pass  # dot ran past the layout's own timeout; the text it was given is all we need
        layout_module.subprocess.run = real_run
        cap = PEER_CAP_S if args.blocks else None
        walls, cpus, _ = timed(raw_dot(captured["input"], cap), 1 if args.blocks else args.runs)
        report["peer_dot_tplain"] = {"median_wall_s": statistics.median(walls), "median_cpu_s": statistics.median(cpus)}
    for view_name in views:
        for name in engines if not args.blocks else ["layered"]:  # dot gives up on 12,500 nodes
            key = name if len(views) == 1 else f"{name} {view_name}"
            report["engines"][key] = measure(graph, spec if view_name != "forward" else None, view_name, name, args.runs)
            if "peer_dot_tplain" in report and view_name == views[0]:
                report["engines"][key]["ratio_to_raw_dot"] = (report["engines"][key]["median_wall_s"]
                                                             / report["peer_dot_tplain"]["median_wall_s"])
    report["load_average_after"] = os.getloadavg()

    print(f"{report['model']}: {report['nodes']} nodes, {args.runs} runs, load average {report['load_average_before'][0]:.1f}"
          f" on {report['cpus']} CPUs")
    if "peer_dot_tplain" in report:
        peer = report["peer_dot_tplain"]
        print(f"  peer: dot -Tplain alone      median {peer['median_wall_s']:.3f} s wall, {peer['median_cpu_s']:.3f} s CPU")
    for name, e in report["engines"].items():
        ratio = f", {e['ratio_to_raw_dot']:.2f}x raw dot" if "ratio_to_raw_dot" in e else ""
        verdict = "under" if e["under_budget"] else "OVER"
        print(f"  {name:17s} layout ({e['view_nodes']} nodes) median {e['median_wall_s']:.3f} s wall "
              f"(min {e['min_wall_s']:.3f}), "
              f"{e['median_cpu_s']:.3f} s CPU{ratio}: {verdict} the {BUDGET_S:.0f} s budget; "
              f"{e['width']}x{e['height']} cells; canvas index {e['canvas_index_s'] * 1000:.0f} ms, "
              f"160x50 viewport {e['viewport_160x50_ms']:.2f} ms")
    if args.json:
        write_json(args.json, report, indent=2)
        print(f"wrote {args.json}")
    return 0 if all(e["under_budget"] for e in report["engines"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
