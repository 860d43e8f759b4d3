"""The exports of the tools people use, against issue 33's targets: one row per built case.

Cases: what benchmarks/build_tool_exports.py builds (YOLO11n, diffusers UNets through both
exporters, optimum Llama with past, T5 and Whisper merged decoders, the Whisper encoder,
onnxruntime-genai Llama fp32 and int4), each skipped with one line where it is absent.

Per case, each target measured against something we did not write:
- run:      the engine's outputs on the case's feeds against onnxruntime's (worst relative error over
            the outputs; medians of the engine's and onnxruntime's run times, and their ratio);
- grad:     the float64 gradient against torch autograd on the tool's own torch module
            (reference.npz from `build_tool_exports.py --references`; relative L2, worst x);
- check:    `onnxgrad check` with no --mode w.r.t. the case's xs: verdict, whether resolved, seconds;
- lower:    `onnxgrad lower` of the selection, run by onnxruntime, against the engine's gradient
            (relative L2, worst x) and the lowered file's onnxruntime time beside the forward's;
- explorer: the app opens the file, the case's selection is picked, `r` computes a finite gradient
            (with the explorer's own made-up feeds: none are loaded);
- feeds:    `onnxgrad run MODEL` with no feeds: exit code; the same made-up feeds fed to
            onnxruntime give the same outputs (or the one-line error that names the made-up input),
            and no output is all zeros.

    python benchmarks/bench_tools.py [--only yolo11n,unet_dynamo] [--runs 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import write_json  # noqa: E402
from _timing import median_time  # noqa: E402
from _tool_exports import CASES, DEFAULT_OUT, load_case  # noqa: E402

import engine  # noqa: E402

ORT = ["CPUExecutionProvider"]


def _session(path_or_bytes, optimize: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # the lowered files' unused constants are warned about, one line each
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path_or_bytes, opts, providers=ORT)


def _ort_run(session, feeds) -> dict:
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / scale if scale else float(np.linalg.norm(got))


def rel_max(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not want.size:
        return 0.0
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"


def target_run(case, model, runs: int) -> dict:
    session = _session(case["path"])
    want = _ort_run(session, case["feeds"])
    got = model.run(case["feeds"])
    # The merged decoders' with-past branch returns empty encoder presents: nothing to compare there.
    worst = max(rel_max(got[k], v) for k, v in want.items() if v.size)
    engine_s = median_time(lambda: model.run(case["feeds"]), runs)
    ort_s = median_time(lambda: _ort_run(session, case["feeds"]), runs)
    row = {"rel_max": worst, "y_rel_max": rel_max(got[case["y"]], want[case["y"]]), "engine_s": engine_s,
           "ort_s": ort_s, "engine_over_ort": engine_s / ort_s}
    exact = _float_activations(case["path"])
    if exact is not None:  # the int4 kernel's int8 activations are a documented difference: compare without them
        want = _ort_run(_session(exact), case["feeds"])
        row["rel_max_accuracy_level_0"] = max(rel_max(got[k], v) for k, v in want.items() if v.size)
    return row


def _float_activations(path: str) -> bytes | None:
    """The model with every MatMulNBits at accuracy_level 0 (float activations), or None when none
    quantizes its activations."""
    import onnx

    proto = onnx.load(path)
    changed = False
    for node in proto.graph.node:
        for a in list(node.attribute):
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level" and a.i:
                node.attribute.remove(a)
                changed = True
    return proto.SerializeToString() if changed else None


def target_grad(folder) -> dict:
    try:
        from _tool_references_check import reference_errors
    except ImportError:
        return {"skipped": "benchmarks/_tool_references_check.py is absent"}
    if not os.path.exists(os.path.join(folder, "reference.npz")):
        return {"skipped": "no reference.npz (python benchmarks/build_tool_exports.py --references)"}
    return reference_errors(folder)


def target_check(case, folder) -> dict:
    cmd = ["onnxgrad", "check", case["path"], "--y", case["y"], "--xs", ",".join(case["xs"]),
           "--feeds", os.path.join(folder, "feeds.npz"), "--json", "-"]
    if case["zs"]:
        cmd += ["--zs", ",".join(case["zs"])]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"exit": done.returncode, "seconds": seconds, "error": (done.stderr.strip().splitlines() or [""])[-1]}
    return {"exit": done.returncode, "seconds": seconds, "verdict": report.get("verdict"),
            "resolved": report.get("verdict") in ("pass", "fail"), "mode": report.get("mode"),
            "resolved_by": sorted({x.get("resolved_by") for x in report.get("results", []) if x.get("resolved_by")})}


def target_lower(case, model) -> dict:
    from engine.lowering.build import lowered
    from engine.modelfile.writer import write

    feeds, y, xs = case["feeds"], case["y"], case["xs"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lowered.onnx")
        t = time.perf_counter()
        proto, weights = lowered(case["path"], y, ",".join(xs), ",".join(case["zs"]))
        write(proto, weights, out)
        lower_s = time.perf_counter() - t
        # Graph optimizations off: onnxruntime's fusions rewrite the float16/float32 arithmetic we compare.
        session = _session(out, optimize=False)
        got = _ort_run(session, feeds)
        lowered_s = median_time(lambda: _ort_run(session, feeds), 3)
    plain = _session(case["path"], optimize=False)
    forward_s = median_time(lambda: _ort_run(plain, feeds), 3)
    dy = np.ones(got[y].shape, got[y].dtype)
    want = model.gradient(y, xs, case["zs"], feeds, dy=dy).grads
    errors = {x: rel_l2(got[f"d{y}_d{x}"], want[x]) for x in xs if f"d{y}_d{x}" in got}
    finite = all(np.isfinite(got[f"d{y}_d{x}"]).all() for x in errors)
    return {"worst_rel_l2": max(errors.values()), "finite": finite, "y_rel_max": rel_max(got[y], model.run(feeds)[y]),
            "lower_s": lower_s, "ort_lowered_s": lowered_s, "ort_forward_s": forward_s, "nodes": len(proto.graph.node)}


def target_explorer(case) -> dict:
    from explorer.app import make_app

    async def drive():
        app = make_app(case["path"])
        async with app.run_test(size=(120, 40)) as pilot:
            graph = app.query_one("#graph")
            for _ in range(2000):
                if graph.canvas is not None:
                    break
                await pilot.pause(0.02)
            s = app.session
            s.select(case["y"], case["xs"], case["zs"])
            app.selection_changed()
            t = time.perf_counter()
            await pilot.press("r")
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause(0.05)
            seconds = time.perf_counter() - t
            notes = [n.message for n in app._notifications]  # what a user saw as toasts
            grads = s.gradient.grads if s.gradient is not None else None
            return {"gradient": grads is not None, "seconds": seconds,
                    "finite": grads is not None and all(np.isfinite(g).all() for g in grads.values()),
                    "nonzero": grads is not None and any(np.abs(g).max() > 0 for g in grads.values()),
                    "notifications": [str(n).splitlines()[0][:200] for n in notes][-3:]}

    return asyncio.run(drive())


def target_feeds(case, model) -> dict:
    """What `onnxgrad run MODEL` makes of a model nobody feeds, and whether onnxruntime agrees."""
    from engine.gradient.feeds import complete_feeds

    folder = os.path.dirname(case["path"])
    target = folder if os.path.exists(os.path.join(folder, "genai_config.json")) else case["path"]
    done = subprocess.run(["onnxgrad", "run", target], capture_output=True, text=True, timeout=900)
    row = {"cli_exit": done.returncode, "cli_last": (done.stderr.strip().splitlines() or [""])[-1][:240]}
    outputs = list(model.graph.outputs)
    try:
        made, _ = complete_feeds(model, {}, targets=outputs)
        made = {k: np.asarray(v) for k, v in made.items()}
        got = model.run(made, outputs=outputs)
    except engine.OnnxGradError as exc:
        return {**row, "engine": _line(exc)}
    try:
        want = _ort_run(_session(case["path"]), made)
    except Exception as exc:  # noqa: BLE001 - onnxruntime refusing the made-up feeds is the finding
        return {**row, "ort": _line(exc)}
    zeros = [k for k, v in want.items() if v.size and k in got and not np.any(got[k])]
    return {**row, "ort_rel_max": max(rel_max(got[k], v) for k, v in want.items() if v.size and k in got),
            "all_zero_outputs": zeros}


STAGES = {"run": lambda case, model, folder, runs: target_run(case, model, runs),
          "grad": lambda case, model, folder, runs: target_grad(folder),
          "check": lambda case, model, folder, runs: target_check(case, folder),
          "lower": lambda case, model, folder, runs: target_lower(case, model),
          "explorer": lambda case, model, folder, runs: target_explorer(case),
          "feeds": lambda case, model, folder, runs: target_feeds(case, model)}


def measure(folder: str, stages, runs: int) -> dict:
    case = load_case(folder)
    row = {"tool": case["tool"]}
    model = engine.load(case["path"])
    for stage in stages:
        t = time.perf_counter()
        try:
            row[stage] = STAGES[stage](case, model, folder, runs)
        except Exception as exc:  # noqa: BLE001 - a report: one stage failing does not hide the others
            row[stage] = {"error": _line(exc)}
        print(f"  {stage} ({time.perf_counter() - t:.1f} s): {row[stage]}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the built cases' folder")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per median")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "tools.json"))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CASES)
    stages = [s for s in args.stages.split(",") if s]
    results = {}
    for name in names:
        folder = os.path.join(args.out, name)
        if not os.path.exists(os.path.join(folder, "case.json")):
            print(f"skip {name}: not built (python benchmarks/build_tool_exports.py --only {name})")
            continue
        print(f"== {name}", flush=True)
        results[name] = measure(folder, stages, args.runs)
    write_json(args.json, results)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
