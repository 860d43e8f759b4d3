"""The verifier against wrong VJPs on NNSmith's random graphs, and torch.autograd.gradcheck beside it.

1. Unmutated graphs (float16/32/64): the default check's verdict per selection, against whether the
   engine's float64 gradient agrees with torch autograd through NNSmith's own torch module. Target:
   0 FAIL where they agree, >= 97% resolved PASS.
2. Mutants (engine/conformance/mutants.py) per selection: killed / inconclusive / survived per
   check mode. Targets: 0 survivors in full and fast mode (sample: only where the sample missed the
   change), >= 95% killed by the default.
3. The same mutants applied to the torch module (an autograd.Function with the same wrong
   backward swapped in for the op, tests/nnsmith_graphs.mutate_torch_module), checked by
   gradcheck(fast_mode=True) and gradcheck(fast_mode=False) (xs of at most 10,000 elements), on
   ⟨y⟩ as a function of xs in float64, with gradcheck's default tolerances. Compared on the
   mutants both sides can express and that move both gradients by >= 1%: kills and seconds.

    python benchmarks/bench_mutants.py [--seeds 0:600] [--mutant-seeds 0:60] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import write_json  # noqa: E402

import engine  # noqa: E402
from engine.conformance.mutants import spoil  # noqa: E402
from engine.conformance.mutation import COUNTED, KILLED  # noqa: E402
from tests import nnsmith_graphs as ng  # noqa: E402
from tests.nnsmith_sweep import checked_selections, mutated_selections  # noqa: E402

DTYPES = {"f32-64": ("float32", "float64"), "f16": ("float16", "float32", "float64")}
SLOW_LIMIT = 10_000  # slow gradcheck builds the whole Jacobian: xs of at most this many elements


def _seeds(text: str) -> range:
    lo, hi = (int(v) for v in text.split(":"))
    return range(lo, hi)


def unmutated(seeds: range, dtypes) -> dict:
    counts, notes = collections.Counter(), []
    for seed, y, report, agrees in checked_selections(seeds, dtypes):
        counts[f"{report.verdict}{'' if agrees else ' (engine and torch disagree)'}"] += 1
        if report.verdict != "pass":
            notes.append(f"seed {seed} {y}: {report.verdict}: {report.results[0].reason[:160]}")
    total = sum(counts.values())
    return {"counts": dict(counts), "selections": total,
            "resolved_pass": counts["pass"] / total if total else None, "notes": notes}


def _torch_side(graph, y, xs, mutant, dy):
    """(torch's gradient moved by the mutant, gradcheck fast killed, its seconds, slow killed or None, seconds)."""
    def mutate(true, grads, inputs, outputs):
        return tuple(spoil(mutant.kind, mutant.input, list(true), grads, inputs, None, {}))

    right = np.concatenate([g.reshape(-1) for g in ng.torch_gradient(graph, y, xs, dy).values()])
    try:  # ValueError: the exporter merged or dropped nodes of that type; RuntimeError: the op's torch
        # form cannot take the swap (BatchNorm's running statistics would need gradients): no torch twin
        with ng.mutate_torch_module(graph, mutant.op_type, mutate) as swapped:
            if not swapped:
                return None
            wrong = np.concatenate([g.reshape(-1) for g in ng.torch_gradient(graph, y, xs, dy).values()])
            scale = np.linalg.norm(right)
            if not (np.isfinite(wrong).all() and scale > 0 and np.linalg.norm(wrong - right) >= COUNTED * scale):
                return None
            f, values = ng.torch_function(graph, y, xs), [v.requires_grad_() for v in ng.torch_values(graph, xs)]
            out = [_gradcheck(f, values, True)]
            out.append(_gradcheck(f, values, False) if sum(v.numel() for v in values) <= SLOW_LIMIT else (None, 0.0))
            return out
    except (ValueError, RuntimeError):
        return None


def _gradcheck(f, values, fast: bool) -> tuple[bool, float]:
    started = time.monotonic()  # wall seconds, as run_mutants times the checks (one torch thread: main)
    try:
        ok = torch.autograd.gradcheck(f, values, fast_mode=fast, raise_exception=False)
    except Exception:  # noqa: BLE001 - a mutant gradcheck cannot run counts as not killed
        ok = True
    return (not ok), time.monotonic() - started


def mutants(seeds: range, dtypes, modes=("auto", "full", "fast", "sample")) -> dict:
    tally = {m: collections.Counter() for m in modes}
    survivors, compared = [], collections.Counter()
    seconds = collections.Counter()
    for seed, graph, y, xs, zs, report in mutated_selections(seeds, dtypes, modes):
        for m in modes:
            tally[m].update(report.tally(m))
            survivors += [f"seed {seed} {y} {m}: {o.mutant.label}" for o in report.survivors(m)]
        dy = _check_dy(graph, y, xs, zs)
        for o in report.outcomes:
            if not o.counted:
                continue
            side = _torch_side(graph, y, xs, o.mutant, dy)
            if side is None:
                continue
            (fast_killed, fast_s), (slow_killed, slow_s) = side
            compared["mutants"] += 1
            compared["onnxgrad auto"] += o.outcomes["auto"] == KILLED
            compared["onnxgrad fast"] += o.outcomes.get("fast") == KILLED
            compared["gradcheck fast"] += fast_killed
            seconds["onnxgrad auto"] += o.seconds["auto"]
            seconds["onnxgrad fast"] += o.seconds.get("fast", 0.0)
            seconds["gradcheck fast"] += fast_s
            if slow_killed is not None:
                compared["slow-checkable"] += 1
                compared["gradcheck slow"] += slow_killed
                compared["onnxgrad full (same)"] += o.outcomes.get("full") == KILLED
                seconds["gradcheck slow"] += slow_s
                seconds["onnxgrad full (same)"] += o.seconds.get("full", 0.0)
    return {"tally": {m: dict(t) for m, t in tally.items()}, "survivors": survivors,
            "versus_gradcheck": dict(compared), "seconds": {k: round(v, 2) for k, v in seconds.items()}}


def _check_dy(graph, y, xs, zs):
    """The dy the check used (its seeded random one), so both sides differentiate the same L."""
    from engine.verify.context import build

    return build(engine.load(graph.proto), y, xs, zs, graph.feeds, None, 0, "cpu", False).dy.numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:600", help="graphs for the unmutated sweep (lo:hi)")
    ap.add_argument("--mutant-seeds", default="0:60", help="graphs for the mutants and gradcheck (lo:hi)")
    ap.add_argument("--skip-unmutated", action="store_true")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "mutants.json"))
    args = ap.parse_args()
    if not ng.available():
        print("nnsmith is not installed: pip install 'nnsmith[torch,onnx]==0.1.0'")
        return 0
    torch.set_num_threads(1)
    out = {"torch": torch.__version__}
    for label, dtypes in DTYPES.items():
        if not args.skip_unmutated:
            started = time.monotonic()
            out[f"unmutated {label}"] = u = unmutated(_seeds(args.seeds), dtypes)
            print(f"unmutated {label}: {u['counts']} resolved pass {u['resolved_pass']:.4f} "
                  f"({time.monotonic() - started:.0f}s)", flush=True)
        started = time.monotonic()
        out[f"mutants {label}"] = r = mutants(_seeds(args.mutant_seeds), dtypes)
        print(f"mutants {label}: {r['tally']}\n  versus gradcheck: {r['versus_gradcheck']}\n  seconds: {r['seconds']}"
              f"\n  survivors: {r['survivors'][:20]} ({time.monotonic() - started:.0f}s)", flush=True)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
