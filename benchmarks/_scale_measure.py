"""One measurement of one pretrained-size model, taken in a fresh process (bench_scale.py starts one per
measurement, so no measurement sees another's imports, caches or memory):

    python benchmarks/_scale_measure.py MEASURE MODEL [--threads N] [--calls K]   # prints one JSON object

`MEASURES` maps a measurement's name to a function (case, args) -> dict of figures. A new measurement
(the explorer's time to graph drawn and to ready, say) is one more function registered here; bench_scale
shows the figures of any measurement it is asked for (--measures).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
import _scale_models as scale  # noqa: E402

MEASURES = {}


def measure(fn):
    MEASURES[fn.__name__] = fn
    return fn


def bench_env(threads: int) -> dict:
    """The environment of a measured process: this checkout first, the thread count, and Python's
    bytecode cache on as on any install (a sandbox's PYTHONDONTWRITEBYTECODE would charge every
    import's compilation to the first call that imports)."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(threads))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _engine_ready(args):
    """`import engine, torch` and the thread count: the baseline every engine figure is above."""
    import torch

    import engine

    torch.set_num_threads(args.threads)
    return engine


@measure
def load(case, args) -> dict:
    """engine.load on the model file (the process has imported engine and torch already)."""
    engine = _engine_ready(args)
    start = time.perf_counter()
    engine.load(case.path)
    return {"load_s": time.perf_counter() - start}


@measure
def ort(case, args) -> dict:
    """onnxruntime InferenceSession creation (CPU provider, default graph optimizations)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    start = time.perf_counter()
    onnxruntime.InferenceSession(case.path, options, providers=["CPUExecutionProvider"])
    return {"ort_session_s": time.perf_counter() - start}


@measure
def memory(case, args) -> dict:
    """Peak RSS added above `import engine, torch` by load + one gradient of the deep weight."""
    engine = _engine_ready(args)
    base = rss()
    model = engine.load(case.path)
    weight = scale.deep_weight(model.graph, case)
    model.gradient(case.output, [weight], list(case.inputs), feeds=scale.example(case))
    return {"rss_added_bytes": peak_rss() - base, "model_bytes": case.bytes()}


@measure
def eager_memory(case, args) -> dict:
    """The peer of `memory`: peak RSS added above `import torch` and the model's library (timm or
    transformers) by building the exported module (its weights in memory once) and one torch eager
    gradient of the same deep weight, only it requiring grad. What torch itself needs for the
    computation the engine is measured on."""
    import torch

    torch.set_num_threads(args.threads)
    scale.import_library(case)
    base = rss()
    module = scale.module(case)
    for p in module.parameters():
        p.requires_grad_(False)
    built = rss()
    reset = _reset_peak()
    weight = scale.deep_parameter(case, module).requires_grad_()
    out = module(*[torch.from_numpy(v) for v in scale.example(case).values()])
    out.backward(torch.ones_like(out))
    assert weight.grad is not None
    row = {"eager_rss_added_bytes": peak_rss() - base, "model_bytes": case.bytes()}
    if reset:  # the gradient's own peak above the built module, plus the weights once: no construction leftovers
        weights = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
        row["eager_floor_bytes"] = _peak_since_reset() - built + weights
    return row


def _reset_peak() -> bool:
    """Restart the kernel's peak-RSS count from now (Linux's clear_refs); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_since_reset() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _engine_gradient(case, args):
    """Model.gradient of the output (dy = ones) by the deep weight, zs = the inputs, as a call, after a
    first call (which builds the plan); and that first call's seconds."""
    engine = _engine_ready(args)
    model = engine.load(case.path)
    weight = scale.deep_weight(model.graph, case)
    feeds = scale.example(case)

    def call():
        model.gradient(case.output, [weight], list(case.inputs), feeds=feeds)

    first = time.perf_counter()
    call()
    return call, time.perf_counter() - first


def _eager_gradient(case, args):
    """The same gradient in torch eager on the module that was exported: forward, backward of
    ones, only the deep weight requiring grad; as a call, after a first call."""
    import torch

    torch.set_num_threads(args.threads)
    module = scale.module(case)
    for p in module.parameters():
        p.requires_grad_(False)
    weight = scale.deep_parameter(case, module).requires_grad_()
    inputs = [torch.from_numpy(v) for v in scale.example(case).values()]

    def call():
        weight.grad = None
        out = module(*inputs)
        out.backward(torch.ones_like(out))

    call()
    return call


@measure
def gradient(case, args) -> dict:
    """Seconds per Model.gradient call (`calls` calls after the first)."""
    call, first = _engine_gradient(case, args)
    times, cpu = timed(call, args.calls)
    return {"gradient_s": statistics.median(times), "gradient_cpu_s": statistics.median(cpu), "gradient_first_s": first,
            "gradient_times": times}


@measure
def eager(case, args) -> dict:
    """Seconds per torch eager forward+backward (`calls` calls after the first)."""
    times, cpu = timed(_eager_gradient(case, args), args.calls)
    return {"eager_s": statistics.median(times), "eager_cpu_s": statistics.median(cpu), "eager_times": times}


@measure
def gradient_pair(case, args) -> dict:
    """Both gradients in this process, calls alternating (the model's weights in memory twice):
    medians of each side and of the per-pair ratios."""
    ours, first = _engine_gradient(case, args)
    theirs = _eager_gradient(case, args)
    rows = []
    for _ in range(args.calls):
        a, b = timed(ours, 1), timed(theirs, 1)
        rows.append((a[0][0], b[0][0], a[1][0], b[1][0]))
    return {"gradient_s": statistics.median(r[0] for r in rows), "eager_s": statistics.median(r[1] for r in rows),
            "gradient_cpu_s": statistics.median(r[2] for r in rows), "eager_cpu_s": statistics.median(r[3] for r in rows),
            "ratio": statistics.median(r[0] / r[1] for r in rows),
            "ratio_cpu": statistics.median(r[2] / r[3] for r in rows), "gradient_first_s": first}


def timed(call, calls: int) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of each of `calls` calls (CPU time is steadier on a shared machine)."""
    wall, cpu = [], []
    for _ in range(calls):
        w, c = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return wall, cpu


@measure
def check(case, args) -> dict:
    """`onnxgrad check --mode fast` on the deep weight: the whole command's wall time, and the time
    the check itself reports taking inside it (`check()` alone, measured in this process)."""
    engine = _engine_ready(args)
    from engine.verify import check as run_check

    model = engine.load(case.path)
    weight = scale.deep_weight(model.graph, case)
    feeds = scale.example(case)
    start = time.perf_counter()
    report = run_check(model, case.output, [weight], list(case.inputs), feeds=feeds, mode="fast")
    own = time.perf_counter() - start
    import numpy as np

    feed_args = []
    for name, value in feeds.items():
        path = os.path.join(args.tmp, f"{name}.npy")
        np.save(path, value)
        feed_args += ["--feed", f"{name}={path}"]
    cmd = [sys.executable, "-m", "engine", "check", case.path, "--y", case.output, "--xs", weight,
           "--zs", ",".join(case.inputs), "--mode", "fast", *feed_args]
    env = bench_env(args.threads)
    start = time.perf_counter()
    code, peak, stderr = _run_measured(cmd, env)
    whole = time.perf_counter() - start
    return {"check_own_s": own, "check_command_s": whole, "check_verdict": report.verdict,
            "check_command_exit": code, "check_command_stderr": stderr.strip()[-300:],
            "check_command_peak_rss_bytes": peak, "check_command_peak_rss_ratio": peak / case.bytes()}


def _run_measured(cmd, env) -> tuple[int, int, str]:
    """(exit status, the command's own peak RSS in bytes, its stderr). A child's peak RSS counts the
    memory of the process it was forked from (the kernel carries the old image's high-water mark over
    `exec`), and this process holds a model: a small launcher starts the command and reports it."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], env=env, capture_output=True, text=True)
    code, peak_kb = map(int, done.stdout.split()[-2:])
    return code, peak_kb * 1024, done.stderr  # kilobytes on Linux


_LAUNCHER = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL); "
             "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


@measure
def explorer(case, args) -> dict:
    """The explorer opened on the model, from before the load (bench_explorer.py --ready): seconds to
    the graph drawn and to ready (navigator listed, whole layout done, cursor's value shown), and
    key latencies while the start's background work and a gradient of the biggest weight run."""
    import asyncio

    _engine_ready(args)
    import bench_explorer

    run = asyncio.run(bench_explorer.ready_run(case.path))
    keys = sorted(run["keys_while_starting"] + run["keys_while_gradient"])
    return {"graph_drawn_s": run["graph_paint_s"], "ready_s": run["ready_s"], "ready_cpu_s": run["ready_cpu_s"],
            "listed_s": run["listed_s"],
            "laid_out_s": run["laid_out_s"], "value_s": run["value_s"], "key_median_s": statistics.median(keys),
            "key_max_s": keys[-1]}


@measure
def graph(case, args) -> dict:
    """`onnxgrad graph MODEL --y OUT --xs <a weight of the last block> --zs INPUTS --view combined -o
    g.svg`, as the command does it: seconds to load, then to build the view, lay it out and draw it
    (the issue's target counts what follows the load), and who laid it out."""
    engine = _engine_ready(args)
    from engine.graphs.svg import render_view
    from engine.graphs.view import build_view

    start = time.perf_counter()
    model = engine.load(case.path)
    loaded = time.perf_counter()
    spec = model.selection(case.output, [scale.deep_weight(model.graph, case, case.last)], list(case.inputs))
    view = build_view(model, spec, "combined")
    built = time.perf_counter()
    stages = []
    by = render_view(view, os.path.join(args.tmp, f"{case.name}_combined.svg"),
                     progress=lambda stage: stages.append((stage, time.perf_counter())))
    done = time.perf_counter()
    return {"graph_load_s": loaded - start, "graph_svg_s": done - loaded, "graph_view_s": built - loaded,
            "graph_nodes": len(view.nodes), "graph_laid_out_by": by,
            "graph_stages": {text: round(at - loaded, 3) for text, at in stages}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("measure", choices=sorted(MEASURES))
    p.add_argument("model", choices=[c.name for c in scale.CASES])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--tmp", default=os.path.join(scale.CACHE, "tmp"))
    args = p.parse_args(argv)
    os.makedirs(args.tmp, exist_ok=True)
    out = MEASURES[args.measure](scale.case(args.model), args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
