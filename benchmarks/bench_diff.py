"""`onnxgrad diff` at real size: GPT-2 124M against its own float16 run, time and peak memory.

Issue 34's scale targets: peak RSS <= 2.5x the larger model's bytes, and time <= 3x the sum of A's and
B's `onnxgrad grad` on the same selection. Each command runs in its own process (its peak RSS is
its own); medians of --runs. B's float16 gradient has no CLI form (`grad --dtype` takes float32 and
float64), so B's grad time is taken as A's: the ratio printed is diff / (2 x grad).

The model is the one benchmarks/bench_scale.py exports (~/.cache/onnxgrad-bench/scale/gpt2-v1/gpt2.onnx);
the benchmark is skipped with one line where it is absent.

    python benchmarks/bench_diff.py [--runs 3] [--sequence 32] [--model PATH] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.expanduser("~/.cache/onnxgrad-bench/scale/gpt2-v1/gpt2.onnx")
X = "model.transformer.h.0.attn.c_attn.weight"
# Runs a command and prints its own peak RSS (ru_maxrss of the child, KiB on Linux) on the last line.
PEAK = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.PIPE, text=True); print(done.returncode, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stderr.write(done.stderr[-400:])")


def measured(cmd: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in bytes, exit code) of one run of `cmd` in a fresh process."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    code, kib = done.stdout.split()[-2:]
    return seconds, int(kib) * 1024, int(code)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=GPT2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sequence", type=int, default=32)
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "diff.json"))
    args = ap.parse_args(argv)
    if not os.path.exists(args.model):
        print(f"skip: {args.model} is absent (python benchmarks/bench_scale.py exports it)")
        return 0
    selection = ["--y", "logits", "--xs", X, "--zs", "inputs", "--dim", f"sequence={args.sequence}"]
    commands = {"grad": ["onnxgrad", "grad", args.model, *selection],
                "diff": ["onnxgrad", "diff", args.model, "--dtype", "float16", *selection]}
    samples: dict[str, list[tuple[float, float, int]]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():  # interleaved: load drifts hit both alike
            samples[name].append(measured(cmd))
    size = os.path.getsize(args.model)
    out = {"model": args.model, "model_bytes": size, "sequence": args.sequence, "runs": args.runs}
    for name, rows in samples.items():
        out[name] = {"seconds": statistics.median(r[0] for r in rows), "peak_rss": max(r[1] for r in rows),
                     "exit_codes": sorted({r[2] for r in rows})}
    out["time_ratio"] = out["diff"]["seconds"] / (2 * out["grad"]["seconds"])
    out["rss_over_model"] = out["diff"]["peak_rss"] / size
    print(f"{os.path.basename(args.model)} ({size / 2**20:.0f} MiB), sequence {args.sequence}, {args.runs} runs")
    for name in commands:
        print(f"  {name:5s} {out[name]['seconds']:7.1f} s  peak RSS {out[name]['peak_rss'] / 2**30:.2f} GiB  "
              f"exit {out[name]['exit_codes']}")
    print(f"  diff / (2 x grad) = {out['time_ratio']:.2f} (target <= 3); diff peak RSS / model bytes = "
          f"{out['rss_over_model']:.2f} (target <= 2.5)")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
