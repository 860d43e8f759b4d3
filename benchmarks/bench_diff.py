"""`onnxgrad diff` at real size: GPT-2 124M against its own float16 run, time and peak memory.

Issue 34's scale targets: peak RSS <= 2.5x the larger model's bytes, and time <= 3x the sum of A's and
B's `onnxgrad grad` on the same selection. Each command runs in its own process (its peak RSS is
its own); medians of --runs, the commands interleaved. A's gradient is `onnxgrad grad`; B's is the
same selection in float16, which the CLI's `grad --dtype` does not offer, so it is `Model.gradient(...,
dtype="float16")` from a `python -c` (the same imports and load). The ratio is diff / (grad A + grad B).

The models are the ones benchmarks/_scale_models.py exports (GPT-2 124M, and GPT-2 large with external
data, `python benchmarks/_scale_models.py build gpt2_large`); one that is absent is skipped with a line.

    python benchmarks/bench_diff.py [--runs 3] [--sequence 32] [--models gpt2,gpt2_large] [--json FILE]
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
SCALE = os.path.expanduser("~/.cache/onnxgrad-bench/scale")
MODELS = {"gpt2": os.path.join(SCALE, "gpt2-v1", "gpt2.onnx"),
          "gpt2_large": os.path.join(SCALE, "gpt2_large-v1", "gpt2_large.onnx")}
X = "model.transformer.h.0.attn.c_attn.weight"
HALF_GRAD = ("import sys, engine; m = engine.load(sys.argv[1]); m.gradient('logits', [sys.argv[2]], 'inputs', "
             "dims={'sequence': int(sys.argv[3])}, dtype='float16')")
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


def model_bytes(path: str) -> int:
    """The file plus its external data (every other file of its folder: the exporter writes one)."""
    folder = os.path.dirname(path)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def weight_of(path: str) -> str:
    """The first block's attention weight, under either exporter's naming."""
    import onnx

    names = [i.name for i in onnx.load(path, load_external_data=False).graph.initializer]
    return next(n for n in names if n.endswith("h.0.attn.c_attn.weight"))


def measure(path: str, runs: int, sequence: int) -> dict:
    x = weight_of(path)
    selection = ["--y", "logits", "--xs", x, "--zs", "inputs", "--dim", f"sequence={sequence}"]
    commands = {"grad_a": ["onnxgrad", "grad", path, *selection],
                "grad_b": [sys.executable, "-c", HALF_GRAD, path, x, str(sequence)],
                "diff": ["onnxgrad", "diff", path, "--dtype", "float16", *selection]}
    samples: dict[str, list[tuple[float, float, int]]] = {k: [] for k in commands}
    for _ in range(runs):
        for name, cmd in commands.items():  # interleaved: load drifts hit all alike
            samples[name].append(measured(cmd))
    size = model_bytes(path)
    out = {"model": path, "model_bytes": size, "sequence": sequence, "runs": runs, "x": x}
    for name, rows in samples.items():
        out[name] = {"seconds": statistics.median(r[0] for r in rows), "peak_rss": max(r[1] for r in rows),
                     "exit_codes": sorted({r[2] for r in rows})}
    out["time_ratio"] = out["diff"]["seconds"] / (out["grad_a"]["seconds"] + out["grad_b"]["seconds"])
    out["rss_over_model"] = out["diff"]["peak_rss"] / size
    print(f"{os.path.basename(path)} ({size / 2**20:.0f} MiB), sequence {sequence}, {runs} runs")
    for name in commands:
        print(f"  {name:6s} {out[name]['seconds']:7.1f} s  peak RSS {out[name]['peak_rss'] / 2**30:.2f} GiB  "
              f"exit {out[name]['exit_codes']}")
    print(f"  diff / (grad A + grad B) = {out['time_ratio']:.2f} (target <= 3); diff peak RSS / model bytes = "
          f"{out['rss_over_model']:.2f} (target <= 2.5)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sequence", type=int, default=32)
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "diff.json"))
    args = ap.parse_args(argv)
    results = {}
    for name in args.models.split(","):
        path = MODELS.get(name, name)
        if not os.path.exists(path):
            print(f"skip {name}: {path} is absent (python benchmarks/_scale_models.py build {name} exports it)")
            continue
        results[name] = measure(path, args.runs, args.sequence)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
