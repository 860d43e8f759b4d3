"""The full attribute fuzz (issue 35): every integer attribute of every registered op with a test case
(onnx's node test cases, the contrib conformance cases, every node of the sample models), each element
of every integer list, at ±2³¹, 2³¹ − 1, 0 and rank ± 1; load, run and gradient under an address-space
cap (tests/attribute_fuzz.py). Then the cost of the checks: a run of every sample model and of a
Conv/pool stack with the attribute checks and without, per step.

    python benchmarks/fuzz_attributes.py [--memory-gb 4] [--out benchmarks/results/fuzz_attributes.json]

Prints the counts; `unnamed` lists the mutants refused without naming their attribute, `escape` the
failures that are not a one-line OnnxGradError.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

EXTREME = re.compile(r" = -?214748364[78]: ")


def sweep(memory_gb: float) -> dict:
    """tests/attribute_fuzz.py over every mutant, in a child process: a child the kernel or a crash ends is
    counted as a kill (with the mutant it was running) and a new child goes on from the next mutant."""
    import subprocess
    import tempfile

    from engine.ops.attribute_ranges import UNCHECKED

    script = os.path.join(ROOT, "tests", "attribute_fuzz.py")
    total: dict = {"kills": []}
    start, begun = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        progress = os.path.join(tmp, "progress")
        while True:
            if os.path.exists(progress):
                os.remove(progress)
            proc = subprocess.run([sys.executable, script, "--start", str(start), "--progress", progress,
                                   "--memory-gb", str(memory_gb)], capture_output=True, text=True, cwd=ROOT)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode == 0 and lines:
                total.update({k: v for k, v in json.loads(lines[-1]).items() if k in ("total", "ops", "op_attribute_pairs")})
                break
            at, label = open(progress).read().split("\t", 1) if os.path.exists(progress) else ("0", "?")
            total["kills"].append(f"{label}: exit {proc.returncode} {proc.stderr.strip().splitlines()[-1:]}")
            start += int(at) + 1
        with open(progress + ".jsonl") as fh:
            records = [json.loads(line) for line in fh]
    counts = collections.Counter(r["outcome"] for r in records)
    total.update({k: counts.get(k, 0) for k in ("ran", "named", "downstream", "unnamed", "escape", "skipped")})
    total["mutants"] = len(records) - counts.get("skipped", 0) + len(total["kills"])
    for kind in ("unnamed", "escape"):
        total[kind] = [f"{r['label']}: {r['message']}" for r in records if r["outcome"] == kind]
    unnamed = total["unnamed"]

    def attribute_of(line: str) -> str:
        return line.split(": ")[1].split(" = ")[0].split("[")[0]

    total.update(
        extreme_unnamed_with_a_range=[u for u in unnamed if EXTREME.search(u) and attribute_of(u) not in UNCHECKED],
        extreme_unnamed_unchecked=[u for u in unnamed if EXTREME.search(u) and attribute_of(u) in UNCHECKED],
        seconds=round(time.perf_counter() - begun, 1))
    return total


def step_cost(repeats: int = 50, rounds: int = 7) -> dict:
    """Microseconds per run of the sample models with the attribute checks and without them (rules_for giving
    none, so a step of an op without a validator is not wrapped at all), the best of `rounds` interleaved
    rounds: the steady state, where a step's signature was seen and the wrapper only looks it up."""
    import glob

    import onnx
    from onnx import numpy_helper

    import engine
    from engine.ops import attribute_ranges

    out = {}
    real = attribute_ranges.rules_for
    for path in sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.onnx"))):
        proto = onnx.load(path)
        given = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        feeds = {i.name: given[i.name] for i in proto.graph.input if i.name in given}  # fed: every run computes
        models = {}
        for label in ("checked", "unchecked"):
            attribute_ranges.rules_for = real if label == "checked" else (lambda *a: ())
            try:
                models[label] = engine.load(path)
                models[label].run(feeds)
            except engine.OnnxGradError:  # a sample with inputs to feed: its initializer-fed siblings say the same
                models.clear()
                break
            finally:
                attribute_ranges.rules_for = real
        if not models or any(n.op_type == "Gradient" for n in models["checked"].graph.nodes):
            continue
        best = {"checked": float("inf"), "unchecked": float("inf")}
        for _ in range(rounds):
            for label, model in models.items():
                t = time.perf_counter()
                for _ in range(repeats):
                    model.run(feeds)
                best[label] = min(best[label], (time.perf_counter() - t) / repeats)
        steps = len(models["checked"].graph.nodes)
        out[os.path.basename(path)] = {"steps": steps, "us_per_run_checked": round(best["checked"] * 1e6, 1),
                                       "us_per_run_unchecked": round(best["unchecked"] * 1e6, 1),
                                       "us_per_step": round((best["checked"] - best["unchecked"]) / steps * 1e6, 2)}
    import torch

    out["steady_state_us_per_step"] = wrapper_cost()
    # the first call of a shape: the checks themselves, for a Conv with every spatial attribute set

    from engine.ops.attribute_ranges import check, rules_for

    attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
    rules = rules_for("Conv", attrs)
    args = [torch.empty(1, 8, 32, 32), torch.empty(16, 8, 3, 3)]
    t = time.perf_counter()
    for _ in range(2000):
        check(rules, args, attrs)
    out["conv_first_call_check_us"] = round((time.perf_counter() - t) / 2000 * 1e6, 2)
    return out


def wrapper_cost(n: int = 20000) -> dict:
    """A checked Softmax step against its bare forward, on a shape already seen: what every run pays per step
    of an op with a range (the sample models' timings above are within this machine's noise). The forward is
    a no-op here, so the difference is the wrapper's alone."""
    import types

    import torch
    from onnx import helper

    from engine.registry import lookup
    from engine.run.validation import checked

    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    graph = types.SimpleNamespace(nodes=[node], opset=lambda domain: 18)
    assert lookup("", "Softmax", 18) is not None

    def fn(x, *, axis=-1):
        return x

    step = checked(graph, [0, "sm", "Softmax", fn, (0,), (1,), {"axis": 1}])[3]
    x = torch.zeros(2, 3)
    step(x, axis=1)
    best = {}
    for label, f in (("bare", fn), ("checked", step)) * 3:
        t = time.perf_counter()
        for _ in range(n):
            f(x, axis=1)
        best[label] = min(best.get(label, float("inf")), (time.perf_counter() - t) / n * 1e6)
    return {"bare_us": round(best["bare"], 2), "checked_us": round(best["checked"], 2),
            "overhead_us": round(best["checked"] - best["bare"], 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-gb", type=float, default=4.0)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "fuzz_attributes.json"))
    p.add_argument("--no-sweep", action="store_true", help="only the cost per step")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch  # noqa: F401 - imported before the sweep caps the address space

    result = {} if args.no_sweep else sweep(args.memory_gb)
    result["cost"] = step_cost()
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({k: v if not isinstance(v, list) else len(v) for k, v in result.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
