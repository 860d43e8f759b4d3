"""Pretrained-size models (issue 18): cost against the model's bytes and against onnxruntime and torch.

The four models of benchmarks/_scale_models.py (timm resnet50; transformers BERT-base, GPT-2 124M,
GPT-2 large with one external data file; random perturbed weights, exported once and cached) are
measured each in a fresh process (benchmarks/_scale_measure.py), the two sides of a ratio alternating:

  load      engine.load ÷ onnxruntime InferenceSession creation (CPU provider)
  memory    peak RSS added above `import engine, torch` by load + one gradient ÷ the model's bytes; its
            peer (--no-eager-memory to skip): torch eager building the module and taking the same
            gradient, peak RSS added above `import torch` and timm/transformers ÷ the same bytes
  gradient  Model.gradient of the output by a weight in the first block (zs = the inputs, 32 tokens,
            dy = ones) ÷ torch eager forward+backward of the same weight, same thread count (wall
            time, or with --clock cpu the process CPU time, steadier on a shared machine); both in
            one fresh process per round, calls alternating, unless the model is too big to hold
            twice (--pair-gb): then alternating fresh processes
  check     `onnxgrad check --mode fast` on GPT-2 124M: the whole command ÷ the check's own time
  explorer  (--measures ...,explorer) the explorer opened on the model: seconds to the graph drawn and
            to ready (navigator listed, layout done, cursor's value shown), from before the load
  graph     (--measures ...,graph) `onnxgrad graph --view combined -o g.svg` with a weight of the last
            block: seconds from the end of the load to the SVG written, and the view's node count

Ratios are medians over --runs rounds (per-round ratios); each gradient process times --calls calls
after its first. Other measurements registered in _scale_measure.MEASURES (the explorer's, say) run
with --measures and are reported as medians of their figures.

    python benchmarks/bench_scale.py [--models resnet50,gpt2] [--runs 3] [--threads 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _scale_measure as measures  # noqa: E402
import _scale_models as scale  # noqa: E402
from _results import write_json  # noqa: E402
from _scale_measure import bench_env  # noqa: E402

BUILT_IN = ("load", "memory", "gradient", "check")


def take(measure: str, model: str, args) -> dict:
    """One measurement in a fresh process."""
    cmd = [sys.executable, os.path.join(HERE, "_scale_measure.py"), measure, model, "--threads", str(args.threads),
           "--calls", str(args.calls)]
    env = bench_env(args.threads)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{measure} on {model} failed: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratio_rounds(a: str, b: str, key_a: str, key_b: str, model: str, args) -> dict:
    """Alternating rounds of measurement a and b; the median per-round ratio a/b."""
    rows = []
    for k in range(args.runs):
        first, second = (a, b) if k % 2 == 0 else (b, a)
        got = {first: take(first, model, args), second: take(second, model, args)}
        rows.append((got[a][key_a], got[b][key_b]))
        print(f"  {model} {a}/{b} round {k + 1}: {rows[-1][0]:.3f} s / {rows[-1][1]:.3f} s", file=sys.stderr, flush=True)
    return {key_a: statistics.median(r[0] for r in rows), key_b: statistics.median(r[1] for r in rows),
            "ratio": statistics.median(r[0] / r[1] for r in rows), "rounds": rows}


def median_of(measure: str, model: str, args) -> dict:
    runs = [take(measure, model, args) for _ in range(args.runs)]
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        out[key] = statistics.median(values) if all(isinstance(v, (int, float)) for v in values) else values[-1]
    return out


def bench(model: str, args) -> dict:
    row = {"model": model, "model_bytes": scale.case(model).bytes()}
    wanted = args.measures.split(",")
    if "load" in wanted:
        row["load"] = ratio_rounds("load", "ort", "load_s", "ort_session_s", model, args)
    if "memory" in wanted:
        runs = [take("memory", model, args) for _ in range(max(1, args.memory_runs))]
        added = statistics.median(r["rss_added_bytes"] for r in runs)
        row["memory"] = {"rss_added_bytes": added, "ratio": added / row["model_bytes"]}
        print(f"  {model} memory: {added / 1e9:.2f} GB added, {row['memory']['ratio']:.2f}x the model", file=sys.stderr)
        if args.eager_memory:
            peer = [take("eager_memory", model, args) for _ in range(max(1, args.memory_runs))]
            for key in ("eager_rss_added_bytes", "eager_floor_bytes"):
                if all(key in r for r in peer):
                    row["memory"][key] = statistics.median(r[key] for r in peer)
            row["memory"]["eager_ratio"] = row["memory"]["eager_rss_added_bytes"] / row["model_bytes"]
            print(f"  {model} torch eager memory: {row['memory']['eager_ratio']:.2f}x the model", file=sys.stderr)
    if "gradient" in wanted:
        cpu = "_cpu" if args.clock == "cpu" else ""
        if 2 * row["model_bytes"] <= args.pair_gb * 1e9:  # both sides in one process, calls alternating
            rounds = [take("gradient_pair", model, args) for _ in range(args.runs)]
            for k, r in enumerate(rounds):
                print(f"  {model} gradient/eager pair {k + 1}: {r[f'gradient{cpu}_s']:.3f} s / {r[f'eager{cpu}_s']:.3f} s",
                      file=sys.stderr, flush=True)
            row["gradient"] = {key: statistics.median(r[key] for r in rounds)
                               for key in ("gradient_s", "eager_s", "gradient_cpu_s", "eager_cpu_s")}
            row["gradient"]["ratio"] = statistics.median(r[f"ratio{cpu}"] for r in rounds)
            row["gradient"]["paired"] = "same process"
        else:  # too big to hold twice: fresh processes, alternating
            row["gradient"] = ratio_rounds("gradient", "eager", f"gradient{cpu}_s", f"eager{cpu}_s", model, args)
            row["gradient"]["paired"] = "alternating processes"
        row["gradient"]["clock"] = args.clock
    if "check" in wanted and model in args.check_models.split(","):
        got = median_of("check", model, args)
        got["ratio"] = got["check_command_s"] / got["check_own_s"]
        row["check"] = got
    for extra in wanted:
        if extra not in BUILT_IN and extra in measures.MEASURES:
            row[extra] = median_of(extra, model, args)
    return row


def _key(figures: dict, side: str) -> str:
    return f"{side}_cpu_s" if figures.get("clock") == "cpu" else f"{side}_s"


def table(rows: list[dict]) -> str:
    lines = ["| model | bytes | load | ORT session | load ÷ ORT | RSS added | ÷ bytes | torch eager's ÷ bytes | gradient "
             "| eager | ÷ eager | graph drawn | ready |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ld, mem, gr, ex = r.get("load", {}), r.get("memory", {}), r.get("gradient", {}), r.get("explorer", {})
        cells = [r["model"], f"{r['model_bytes'] / 1e9:.2f} GB",
                 f"{ld['load_s']:.2f} s" if ld else "—", f"{ld['ort_session_s']:.2f} s" if ld else "—",
                 f"{ld['ratio']:.2f}×" if ld else "—",
                 f"{mem['rss_added_bytes'] / 1e9:.2f} GB" if mem else "—", f"{mem['ratio']:.2f}×" if mem else "—",
                 f"{mem['eager_ratio']:.2f}×" if "eager_ratio" in mem else "—",
                 f"{gr[_key(gr, 'gradient')]:.3f} s" if gr else "—", f"{gr[_key(gr, 'eager')]:.3f} s" if gr else "—",
                 f"{gr['ratio']:.2f}×" if gr else "—",
                 f"{ex['graph_drawn_s']:.2f} s" if ex else "—", f"{ex['ready_s']:.2f} s" if ex else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    paired = {f"{r['model']}: {r['gradient'].get('paired')}" for r in rows if "gradient" in r}
    if paired:
        clock = next(r["gradient"]["clock"] for r in rows if "gradient" in r)
        lines.append(f"\ngradient ÷ eager ({clock} time): " + "; ".join(sorted(paired)))
    for r in rows:
        if "check" in r:
            c = r["check"]
            lines.append(f"\ncheck --mode fast on {r['model']}: command {c['check_command_s']:.1f} s, check itself "
                         f"{c['check_own_s']:.1f} s ({c['ratio']:.2f}×), verdict {c['check_verdict']}"
                         + (f", peak RSS {c['check_command_peak_rss_bytes'] / 1e9:.2f} GB "
                            f"({c['check_command_peak_rss_ratio']:.2f}× the model's bytes)"
                            if "check_command_peak_rss_bytes" in c else ""))
        for key, value in r.items():
            if key not in BUILT_IN and isinstance(value, dict) and key not in ("load", "memory", "gradient"):
                lines.append(f"\n{key} on {r['model']}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else
                                                                    f"{k} {v}" for k, v in value.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(c.name for c in scale.CASES))
    p.add_argument("--measures", default=",".join(BUILT_IN),
                   help=f"comma-separated, of {', '.join(BUILT_IN)} and any other in _scale_measure.MEASURES")
    p.add_argument("--runs", type=int, default=3, help="rounds per ratio (each side a fresh process)")
    p.add_argument("--memory-runs", type=int, default=1)
    p.add_argument("--eager-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="memory's peer: torch eager building the module and taking the same gradient")
    p.add_argument("--calls", type=int, default=3, help="timed gradient calls per process, after the first")
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads (both sides)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="gradient timing: wall time, or process CPU time (steadier on a shared machine; use --threads 1)")
    p.add_argument("--pair-gb", type=float, default=4.0,
                   help="gradient and eager share one process (calls alternating) when twice the model fits in this")
    p.add_argument("--check-models", default="gpt2", help="models the check measurement runs on")
    p.add_argument("--json", default=os.path.join(HERE, "results", "scale.json"))
    args = p.parse_args(argv)
    names = args.models.split(",")
    scale.ensure(names)
    rows = []
    for name in names:
        print(f"{name} ({scale.case(name).bytes() / 1e9:.2f} GB) ...", file=sys.stderr, flush=True)
        rows.append(bench(name, args))
    print(table(rows))
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "threads": args.threads, "runs": args.runs,
            "calls": args.calls, "clock": args.clock, "load_average": os.getloadavg()[0]}
    write_json(args.json, {"meta": meta, "results": rows})
    print(f"\nload average {meta['load_average']:.2f}; raw figures in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
