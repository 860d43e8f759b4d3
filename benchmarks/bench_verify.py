"""The verifier against torch.autograd.gradcheck, side by side in one process, float64.

    python benchmarks/bench_verify.py            # speed table + false alarms on the sample models
    python benchmarks/bench_verify.py --light    # also the onnx package's light/ models (slow)
    python benchmarks/bench_verify.py --only-fast  # fast mode vs gradcheck(fast_mode=True), 41 runs (a minute)
    python benchmarks/bench_verify.py --only-native  # full check vs gradcheck on the native torch CNNs

Each comparison runs the same function (the engine's float64 plan for y), the same elements (all
of x), and reports medians of several runs. `floor` is the time of the 2N perturbed forwards
alone, batched the way the verifier batches them (vmap or native, chunked); the verifier can go
below it because rows of x that never mix share perturbed forwards (engine/verify/structure.py).
Results go to benchmarks/results/verify.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _results import write_json  # noqa: E402
from _timing import WALL, interleaved, median_time  # noqa: E402

import engine  # noqa: E402
from engine.lowering.build import as_proto  # noqa: E402
from engine.verify import structure  # noqa: E402
from engine.verify.batching import BatchEvaluator  # noqa: E402
from tests import verify_models as vm  # noqa: E402


def engine_function(model: engine.Model, x_name: str = "x"):
    plan = model.prepare([x_name], ["y"], dtype="float64")
    return lambda x: plan.run([x])[0]


def floor_time(fn, x: torch.Tensor, chunk: int, runs: int) -> float:
    """2N perturbed forwards, batched and chunked as the verifier does, nothing else."""
    n = x.numel()
    ev = BatchEvaluator(fn)
    h = 1e-6

    def go():
        for start in range(0, n, chunk // 2):
            ids = torch.arange(start, min(n, start + chunk // 2))
            deltas = torch.zeros((len(ids), n), dtype=x.dtype)
            deltas[torch.arange(len(ids)), ids] = h
            deltas = deltas.reshape((len(ids),) + tuple(x.shape))
            with torch.no_grad():
                ev(torch.cat([x + deltas, x - deltas]))

    return median_time(go, runs)


def without_rows(fn):
    saved = structure.MAX_ROWS
    structure.MAX_ROWS = 1
    try:
        return fn()
    finally:
        structure.MAX_ROWS = saved


def compare(name: str, proto, x_shape, runs: int, gc_runs: int) -> dict:
    model = engine.load(proto)
    x = torch.randn(x_shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    feeds = {"x": x.numpy()}
    f = engine_function(model)
    report = engine.check(model, "y", ["x"], feeds=feeds)
    assert report.verdict == "pass", report.summary()
    (r,) = report.results
    xg = x.clone().requires_grad_()
    t = interleaved({
        "ours": lambda: engine.check(model, "y", ["x"], feeds=feeds),
        "gradcheck": lambda: torch.autograd.gradcheck(f, (xg,), fast_mode=False),
    }, gc_runs)
    ours, gc_full = t["ours"], t["gradcheck"]
    t = interleaved({
        "fast": lambda: engine.check(model, "y", ["x"], feeds=feeds, mode="fast"),
        "fast4": lambda: engine.check(model, "y", ["x"], feeds=feeds, mode="fast", directions=4),
        "gc_fast": lambda: torch.autograd.gradcheck(f, (xg,), fast_mode=True),
    }, runs)
    fast, fast4, gc_fast = t["fast"], t["fast4"], t["gc_fast"]
    # A model of its own: checks of one Model remember whether rows mix (engine/verify/context.py).
    plain_model = engine.load(proto)
    ours_plain = without_rows(lambda: median_time(lambda: engine.check(plain_model, "y", ["x"], feeds=feeds), runs))
    # Back to back: each side's runs in a row, caches warm with its own data (a check in a loop).
    warm_ours = median_time(lambda: engine.check(model, "y", ["x"], feeds=feeds), 3 * runs)
    warm_gc = median_time(lambda: torch.autograd.gradcheck(f, (xg,), fast_mode=False), gc_runs)
    # The first check on a freshly loaded model: plans prepared, batching verified and rows probed
    # anew (later checks of the same Model reuse them).
    first = []
    for _ in range(runs):
        fresh = engine.load(proto)
        gc.collect()
        c = time.process_time()
        engine.check(fresh, "y", ["x"], feeds=feeds)
        first.append(time.process_time() - c)
    first_check = statistics.median(first)
    from engine.verify.check import MAX_CHUNK, MEMORY_BUDGET
    per_forward = sum(v.numel() * 8 for v in model.prepare(["x"], ["y"], dtype="float64", keep_all=True)
                      .run_all([x]).values())
    chunk = int(max(2, min(MAX_CHUNK, MEMORY_BUDGET // per_forward)))
    floor = floor_time(f, x, chunk, runs)
    return {
        "case": name, "elements": x.numel(), "strategy": r.strategy, "rows": r.rows, "forwards": r.forwards,
        "ours_full_s": ours, "ours_full_first_check_s": first_check, "ours_full_no_rows_s": ours_plain,
        "gradcheck_full_s": gc_full,
        "ours_full_back_to_back_s": warm_ours, "gradcheck_full_back_to_back_s": warm_gc,
        "speedup_full_back_to_back": warm_gc / warm_ours,
        "speedup_full": gc_full / ours, "speedup_full_no_rows": gc_full / ours_plain,
        "floor_s": floor, "ours_over_floor": ours / floor, "ours_no_rows_over_floor": ours_plain / floor,
        "ours_fast_s": fast, "ours_fast_4dir_s": fast4, "gradcheck_fast_s": gc_fast,
        "wall_s": dict(WALL), "timing": "median CPU seconds of the process, one torch thread, runs interleaved",
        "speedup_fast": gc_fast / fast, "speedup_fast_4dir": gc_fast / fast4,
    }


def compare_native(case, runs: int, gc_runs: int) -> dict:
    """onnxgrad's full check against gradcheck(fast_mode=False) on the torch module itself: what a
    user would otherwise run (float64, every element of x, one thread, interleaved)."""
    model = engine.load(case.proto)
    feeds, zs = case.feeds, list(case.zs)
    report = engine.check(model, case.y, ["x"], zs, feeds=feeds)
    assert report.verdict == "pass", report.summary()
    (r,) = report.results
    xg = case.x.clone().requires_grad_()
    fn = lambda a: case.module(a, *case.rest)  # noqa: E731
    t = interleaved({"ours": lambda: engine.check(model, case.y, ["x"], zs, feeds=feeds),
                     "gradcheck": lambda: torch.autograd.gradcheck(fn, (xg,), fast_mode=False)}, gc_runs)
    plain_model = engine.load(case.proto)
    plain = without_rows(lambda: median_time(lambda: engine.check(plain_model, case.y, ["x"], zs, feeds=feeds),
                                             max(1, gc_runs // 2)))
    print(f"  {case.name:56} ours {t['ours']:7.3f} s  gradcheck {t['gradcheck']:7.3f} s  "
          f"{t['gradcheck'] / t['ours']:5.1f}x  (no row sharing {t['gradcheck'] / plain:4.1f}x; rows {r.rows}, "
          f"{r.forwards} forwards; load {os.getloadavg()[0]:.1f})", flush=True)
    return {"case": case.name, "elements": case.x.numel(), "rows": r.rows, "forwards": r.forwards,
            "ours_full_s": t["ours"], "gradcheck_native_full_s": t["gradcheck"],
            "speedup_full": t["gradcheck"] / t["ours"], "ours_full_no_rows_s": plain,
            "speedup_full_no_rows": t["gradcheck"] / plain, "wall_s": dict(WALL), "load_average": os.getloadavg()[0],
            "timing": "median CPU seconds of the process, one torch thread, runs interleaved"}


def native_rows(runs: int, gc_runs: int) -> list[dict]:
    from _native_cases import cases

    print("\nfull check vs gradcheck(fast_mode=False) on the native torch module:")
    return [compare_native(c, runs, gc_runs) for c in cases(vm.small_cnn(elem=vm.F64))]


SAMPLE_CASES = [
    ("spec_conv_gemm", "Y", "W,Z", "X", {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)}),
    ("spec_grad_wrt_h", "Y", "H,Z", "", None), ("spec_second_order", "O", "X,W", "L", None),
    ("mlp", "loss", "W1,b1,W2,b2", "X,T", None), ("small_cnn", "logits", "X,conv1_W,bn_scale,bn_B,fc_W", "", None),
    ("transformer_block", "loss", "X,Wq,Wk,Wv,Wo,ln1_scale,W1,W2", "", None),
    ("lstm_step", "loss", "X,W,R,B,initial_h,initial_c", "", None), ("residual_fanout", "loss", "X,W", "", None),
    ("handwritten_backward", "y", "W,X", "", None),
]


def compare_fast(runs: int) -> None:
    """Fast mode against gradcheck's fast mode alone, on both cases (the quick speed check)."""
    for name, proto, shape in FAST_CASES:
        model = engine.load(proto)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        feeds, f, xg = {"x": x.numpy()}, engine_function(model), x.clone().requires_grad_()
        assert engine.check(model, "y", ["x"], feeds=feeds, mode="fast").verdict == "pass"
        t = interleaved({"fast": lambda m=model, fd=feeds: engine.check(m, "y", ["x"], feeds=fd, mode="fast"),
                         "gc_fast": lambda f=f, xg=xg: torch.autograd.gradcheck(f, (xg,), fast_mode=True)}, runs)
        print(f"{name:8} onnxgrad fast {t['fast'] * 1e3:7.3f} ms  gradcheck fast {t['gc_fast'] * 1e3:7.3f} ms  "
              f"speed-up {t['gc_fast'] / t['fast']:.2f}x  (load {os.getloadavg()[0]:.1f})", flush=True)


FAST_CASES = [("chain", vm.deep_chain(elem=vm.F64), (4, 32)), ("cnn", vm.small_cnn(elem=vm.F64), (8, 3, 16, 16))]


def detection(seeds: int) -> dict:
    """The injected-bug catalogue (tests/verify/test_injected.py), each bug at `seeds` points x:
    how often each checker flags it. gradcheck checks the same float64 plan, whose autograd runs
    the wrong VJP; its fast mode draws its vectors from a fixed generator, so x is what varies."""
    from engine.verify import register_op_with_vjp
    from tests.verify.test_injected import BUGS, N, _model, _selection

    rows = {}
    for bug in sorted(BUGS):
        op, since, inputs, forward, wrong, _ = BUGS[bug]
        counts = {"ours_fast": 0, "ours_full": 0, "gradcheck_fast": 0, "gradcheck_full": 0}
        with register_op_with_vjp(op, forward, lambda g, i, o, wrong=wrong: wrong(g, i, o), since=since):
            model = engine.load(_model(op, inputs, since))
            xs = _selection(inputs)
            plan = model.prepare(xs, ["y"], dtype="float64")
            for seed in range(seeds):
                x = np.random.default_rng(seed).standard_normal((N, N))
                for mode in ("fast", "full"):
                    counts[f"ours_{mode}"] += engine.check(model, "y", xs, feeds={"x": x}, mode=mode,
                                                           seed=seed).verdict == "fail"
                leaves = [torch.tensor(x, requires_grad=True)] + [
                    torch.tensor(model.graph.weights[n], dtype=torch.float64,
                                 requires_grad=True) for n in xs[1:]]
                for fast in (True, False):
                    ok = torch.autograd.gradcheck(lambda *a, plan=plan: plan.run(list(a))[0], tuple(leaves), fast_mode=fast,
                                                  raise_exception=False)
                    counts["gradcheck_fast" if fast else "gradcheck_full"] += not ok
        rows[bug] = counts
        print(f"  {bug:28} " + "  ".join(f"{k} {v}/{seeds}" for k, v in counts.items()), flush=True)
    return {"seeds": seeds, "bugs": rows}


def false_alarms_samples(seeds: int) -> dict:
    counts = {"checks": 0, "fail": 0, "inconclusive": 0, "pass": 0}
    for name, y, xs, zs, feeds in SAMPLE_CASES:
        path = os.path.join(vm.SAMPLES, f"{name}.onnx")
        if not os.path.exists(path):
            continue
        import onnx

        for double in (False, True):
            proto = onnx.load(path)
            proto = vm.to_float64(proto) if double else proto
            model = engine.load(proto)
            for seed in range(seeds):
                for mode in ("full", "sample", "fast"):
                    r = engine.check(model, y, xs, zs, feeds=feeds, mode=mode, seed=seed)
                    counts["checks"] += 1
                    counts[r.verdict] += 1
                    if r.verdict != "pass":
                        print(f"  {name} {'f64' if double else 'f32'} seed {seed} {mode}: {r.verdict}", flush=True)
    return counts


def false_alarms_light(stems, time_cap: float, own: bool = False) -> dict:
    """Random O(1) weights: fast on the image, sample on a middle weight, fast on the last. `own`:
    the shipped constant weights (activations up to 1e10, where steps get rounded away), the image
    alone fed: fast on it, sample on the last Conv/Gemm's bias, fast on its weight."""
    counts = {"checks": 0, "fail": 0, "inconclusive": 0, "pass": 0, "models": []}
    for path in vm.light_models():
        stem = os.path.basename(path)[6:-5]
        if stems and stem not in stems:
            continue
        model = engine.load(path)
        feeds, made = vm.light_feeds(model)
        data = model.inputs[0]
        picks = [([data], "fast"), ([made[len(made) // 2]], "sample"), ([made[-1]], "fast")]
        if own:
            last = [n for n in model.graph.nodes if n.op_type in ("Conv", "Gemm") and n.input[1] in made][-1]
            bias = [[last.input[2]]] if len(last.input) > 2 and last.input[2] in made else []
            feeds = {data: feeds[data]}
            picks = [([data], "fast")] + [(b, "sample") for b in bias] + [([last.input[1]], "fast")]
        for double in (False, True):
            f = feeds if not double else {k: v.astype(np.float64) for k, v in feeds.items()}
            m = model if not double else engine.load(vm.to_float64(as_proto(model)))
            for xs, mode in picks:
                y, zs = vm.light_selection(m, xs)
                t = time.perf_counter()
                r = engine.check(m, y, xs, zs, feeds=f, mode=mode, samples=None if own else 16, time_budget=time_cap)
                counts["checks"] += 1
                counts[r.verdict] += 1
                line = (f"  {stem} {'f64' if double else 'f32'} {xs[0]} {mode}: {r.verdict} "
                        f"({time.perf_counter() - t:.1f}s)")
                counts["models"].append(line.strip())
                print(line, flush=True)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--gc-runs", type=int, default=3, help="runs of the slow full gradcheck on the CNN")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--light", nargs="*", default=None, help="also light/ models (all, or the stems given)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per sample model for the false-alarm count")
    ap.add_argument("--detect-seeds", type=int, default=10, help="points x per injected bug for the detection count")
    ap.add_argument("--only-light", action="store_true", help="only the light/ false-alarm sweep (merged into --out)")
    ap.add_argument("--own", action="store_true", help="with --only-light: the models' own constant weights")
    ap.add_argument("--only-fast", action="store_true", help="only fast mode vs gradcheck's fast mode (41 runs)")
    ap.add_argument("--only-native", action="store_true",
                    help="only the full check vs gradcheck on the native torch modules (merged into --out)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "verify.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.only_fast:
        compare_fast(41)
        return 0
    if args.only_native:
        native = native_rows(args.runs, args.gc_runs)
        merged = {}
        if os.path.exists(args.out):
            with open(args.out) as fh:
                merged = json.load(fh)
        merged["native"] = native
        write_json(args.out, merged)
        return 0
    if args.only_light:
        light = false_alarms_light(args.light or [], time_cap=120.0, own=args.own)
        print(f"  { {k: v for k, v in light.items() if k != 'models'} }")
        merged = {}
        if os.path.exists(args.out):
            with open(args.out) as fh:
                merged = json.load(fh)
        merged["false_alarms_light_own" if args.own else "false_alarms_light"] = light
        write_json(args.out, merged)
        return 0
    rows = [
        compare("deep chain 12 x (MatMul 32x32 -> Tanh), x 4x32", vm.deep_chain(elem=vm.F64), (4, 32),
                args.runs, 3 * args.runs),
        compare("small CNN, x 8x3x16x16", vm.small_cnn(elem=vm.F64), (8, 3, 16, 16), args.runs, args.gc_runs),
    ]
    print(f"\n{'case':48} {'ours':>8} {'gradcheck':>10} {'speedup':>8} {'no-rows':>8} {'floor':>8} "
          f"{'/floor':>7} {'fast':>8} {'gc fast':>8} {'speedup':>8}")
    for r in rows:
        print(f"{r['case']:48} {r['ours_full_s']:8.4f} {r['gradcheck_full_s']:10.4f} {r['speedup_full']:7.1f}x "
              f"{r['speedup_full_no_rows']:7.1f}x {r['floor_s']:8.4f} {r['ours_no_rows_over_floor']:6.2f}x "
              f"{r['ours_fast_s']:8.4f} {r['gradcheck_fast_s']:8.4f} {r['speedup_fast']:7.2f}x")
    print("  no-rows: the verifier with row sharing off; /floor: no-rows time over the floor; "
          "fast: 1 direction, the default (4 directions: "
          + ", ".join(f"{r['speedup_fast_4dir']:.2f}x" for r in rows) + " vs gradcheck fast)")
    print("  runs interleaved with the peer; back to back (each side's runs in a row): "
          + ", ".join(f"{r['speedup_full_back_to_back']:.1f}x" for r in rows))
    native = native_rows(args.runs, args.gc_runs)
    print("\ninjected bugs caught (fast mode: 1 direction vs gradcheck's fast mode):")
    caught = detection(args.detect_seeds)
    print("\nfalse alarms on the sample models (float32 and float64, seeds x modes):")
    samples = false_alarms_samples(args.seeds)
    print(f"  {samples}")
    light = None
    if args.light is not None:
        print("\nfalse alarms on light/ models (fast on the image, sample on a middle weight, fast on the last):")
        light = false_alarms_light(args.light, time_cap=120.0)
        print(f"  { {k: v for k, v in light.items() if k != 'models'} }")
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "threads": args.threads, "cpu": platform.processor() or platform.machine()},
              "runs": args.runs, "speed": rows, "native": native, "detection": caught, "false_alarms_samples": samples}
    if light is not None:
        result["false_alarms_light"] = light
    elif os.path.exists(args.out):  # keep the last light/ run rather than dropping it
        with open(args.out) as fh:
            old = json.load(fh)
        if "false_alarms_light" in old:
            result["false_alarms_light"] = old["false_alarms_light"]
    write_json(args.out, result)
    print(f"\nwrote {os.path.relpath(args.out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
