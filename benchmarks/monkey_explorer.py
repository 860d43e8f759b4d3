"""The explorer under a seeded monkey on a real-size model: crashes and peak memory (issue 35).

One app session (a fresh one only after a crash or a palette quit) takes `--keys` random keys from
tests/explorer/monkey.py: every binding, weighted toward runs, checks, step mode, views, cancels,
feeds, dims and diff, plus typing in dialogs and macros that select `logits` and a weight. After
every key the resident memory is sampled (/proc/self/status); the peak is the kernel's high-water
mark (VmHWM, what `/usr/bin/time` reports), divided by the model's bytes. Every `--census` keys it
also records what the app holds (values, gradients, step traces, check, diff) and the RSS then.

    nice -n 10 python benchmarks/monkey_explorer.py --keys 10000 [--model gpt2|PATH] [--seed 0]
        [--json benchmarks/results/monkey_explorer.json]

GPT-2 124M is the export of benchmarks/_scale_models.py (random weights, dynamic batch and sequence,
int64 input_ids and attention_mask); `python benchmarks/_scale_models.py build gpt2` makes it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import write_json  # noqa: E402

GPT2_XS = ("model.transformer.h.0.mlp.c_fc.weight", "model.transformer.h.11.attn.c_attn.weight",
           "model.transformer.h.5.ln_1.weight", "model.transformer.ln_f.bias", "model.transformer.wte.weight",
           "model.transformer.h.3.attn.c_proj.bias")


def status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _nbytes(obj, seen: set) -> int:
    """Bytes of the numpy arrays and torch tensors reachable through dicts, tuples and dataclasses."""
    import numpy as np
    import torch

    if isinstance(obj, np.ndarray):
        base = obj if obj.base is None else obj.base
        if id(base) in seen:
            return 0
        seen.add(id(base))
        return int(getattr(base, "nbytes", obj.nbytes))
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return int(obj.untyped_storage().nbytes())
    if isinstance(obj, dict):
        return sum(_nbytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v, seen) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_nbytes(getattr(obj, f, None), seen) for f in obj.__dataclass_fields__)
    return 0


def census(app) -> dict:
    """What the app holds, by holder, in MB (arrays shared with the model's weights counted once, first)."""
    from explorer.screens.step import StepScreen

    s = app.session
    seen: set = set()
    weights = s.graph.initializers
    # Values of weights share the weights' memory in the model's dtype: counted apart from the rest.
    out = {"values_of_weights": _nbytes({n: v for n, v in s.values.items() if n in weights}, seen),
           "values": _nbytes({n: v for n, v in s.values.items() if n not in weights}, seen)}
    out["gradient"] = _nbytes(s.gradient, seen)
    out["check"] = _nbytes(s.check, seen)
    out["diff"] = _nbytes(s.diff, seen)
    out["step_traces"] = sum(_nbytes(screen.trace, seen) for screen in app.screen_stack if isinstance(screen, StepScreen))
    return {k: round(v / 2**20, 1) for k, v in out.items()} | {"rss_mb": round(status_kb("VmRSS") / 2**20, 1)}


async def monkey_run(args) -> dict:
    import engine
    from explorer.app import make_app
    from tests.explorer.monkey import Monkey, Targets

    path = args.model
    if path == "gpt2":
        from _scale_models import case

        path = case("gpt2").path
    path = os.path.abspath(path)  # the run works in --workdir
    model_bytes = os.path.getsize(path) + sum(os.path.getsize(os.path.join(os.path.dirname(path), f))
                                              for f in os.listdir(os.path.dirname(path)) if f.endswith(".data"))
    targets = Targets(ys=("logits",), xs=GPT2_XS, feeds=("input_ids", "attention_mask"), dim_sizes=(1, 4, 16, 32)) \
        if "gpt2" in os.path.basename(path) else _targets_of(engine.load(path))
    rss_before = status_kb("VmRSS")
    samples: list = []
    jumps: list = []
    censuses: list = []
    t0 = time.perf_counter()
    last = [rss_before]

    def on_key(app, key) -> None:
        rss = status_kb("VmRSS")
        if rss - last[0] > 64 << 20:  # what a key (with the work it started) added
            s = app.session
            jumps.append({"key_no": monkey.tally.keys, "key": key, "mb": round((rss - last[0]) / 2**20),
                          "rss_mb": round(rss / 2**20), "dtype": s.dtype, "dims": dict(s.dims), "xs": list(s.xs),
                          "screens": [type(x).__name__ for x in app.screen_stack],
                          "workers": sorted(w.group for w in app.workers if w.is_running)})
        last[0] = rss
        if monkey.tally.keys % 100 == 0:
            samples.append((monkey.tally.keys, round(time.perf_counter() - t0, 1), round(rss / 2**20)))
        if monkey.tally.keys % args.census == 0:
            censuses.append({"key_no": monkey.tally.keys} | census(app))
        if monkey.tally.keys % 500 == 0:
            print(f"{monkey.tally.keys} keys  {time.perf_counter() - t0:.0f} s  rss {rss / 2**30:.2f} GB  "
                  f"peak {status_kb('VmHWM') / 2**30:.2f} GB  crashes {len(monkey.tally.crashes)}", flush=True)

    def report(done: bool) -> dict:
        peak = status_kb("VmHWM")
        return {"model": os.path.basename(path), "model_bytes": model_bytes, "seed": args.seed, "finished": done,
                **monkey.tally.as_dict(), "wall_s": round(time.perf_counter() - t0, 1), "peak_rss_bytes": peak,
                "peak_over_model": round(peak / model_bytes, 2), "rss_before_app_bytes": rss_before,
                "rss_samples": samples, "rss_jumps": jumps[:200], "census": censuses,
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "load_avg_1m": round(os.getloadavg()[0], 2)}}

    def on_key_and_save(app, key) -> None:
        on_key(app, key)
        if monkey.tally.keys % 500 == 0:  # a run stopped early still leaves its numbers so far
            write_json(args.json, report(False), indent=1)

    monkey = Monkey(targets, args.seed, settle_p=args.settle_p, settle_s=args.settle_s, on_key=on_key_and_save)
    os.chdir(args.workdir)  # exports land there
    await monkey.play(lambda: make_app(path, dims=dict(args.dim)), args.keys)
    return report(True)


def _targets_of(model):
    from tests.explorer.monkey import Targets

    g = model.graph
    weights = tuple(n for n in g.initializers if model.constants()[n].is_floating_point())
    return Targets(ys=tuple(model.outputs), xs=weights[:8], feeds=tuple(g.inputs))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", help="gpt2 (the scale benchmark's export) or a path")
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--seed", default="0")
    p.add_argument("--settle-p", type=float, default=0.03, help="chance of waiting for the workers after a key")
    p.add_argument("--settle-s", type=float, default=30.0, help="the longest such a wait")
    p.add_argument("--census", type=int, default=250, help="every this many keys, what the app holds")
    p.add_argument("--dim", type=lambda s: (s.split("=")[0], int(s.split("=")[1])), action="append", default=[])
    p.add_argument("--workdir", default="/tmp/monkey_explorer")
    p.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "monkey_explorer.json"))
    args = p.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    args.json = os.path.abspath(args.json)
    result = asyncio.run(monkey_run(args))
    write_json(args.json, result, indent=1)
    short = {k: result[k] for k in ("keys", "crashes", "quits", "apps", "wall_s", "peak_rss_bytes", "peak_over_model",
                                    "results", "macros", "settle_timeouts")}
    print(json.dumps(short, indent=1))
    print(json.dumps(result["notifications"], indent=1))
    if result["crash_details"]:
        print(json.dumps(result["crash_details"], indent=1))
    return 1 if result["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
