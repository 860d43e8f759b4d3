"""The verifier on the exports people bring: the default check's verdict and time, and mutants.

Models: timm and transformers architectures through both torch exporters (benchmarks/_real_models.py)
and the tool exports that benchmarks/build_tool_exports.py builds (YOLO, diffusers UNets, optimum
LLMs with past and merged decoders, onnxruntime-genai fp32/int4), each skipped where it is absent.
For each: the unmutated model's default (auto) verdict and seconds, fast mode's beside it, and up
to --mutants mutants (round robin over the op types on the path; kinds scale_1.05, sign, permute,
zero_part, drop_factor) checked by default and in fast mode. Token-id models are differentiated
with respect to their embedding's output.

    python benchmarks/bench_mutants_real.py [--mutants 16] [--only yolo11n,bert] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _real_models as real_models  # noqa: E402
from _results import write_json  # noqa: E402
from _tool_exports import load_case  # noqa: E402

import engine  # noqa: E402
from engine.conformance.mutants import candidates  # noqa: E402
from engine.conformance.mutation import KILLED, run_mutants  # noqa: E402
from engine.verify.context import build  # noqa: E402

TOOLS = os.path.join(real_models.CACHE, "tools")
KINDS = ("scale_1.05", "sign", "permute", "zero_part", "drop_factor")


def tool_cases():
    for name in sorted(os.listdir(TOOLS)) if os.path.isdir(TOOLS) else ():
        folder = os.path.join(TOOLS, name)
        if os.path.exists(os.path.join(folder, "case.json")):
            case = load_case(folder)
            yield name, (lambda case=case: engine.load(case["path"])), case["y"], case["xs"], case["zs"], case["feeds"]


def real_cases():
    if not real_models.available():
        return
    for case in real_models.CASES:
        module, x = real_models.build(case)
        for exporter in real_models.EXPORTERS:
            try:
                data = real_models.export(module, x, exporter)
            except Exception as exc:  # noqa: BLE001 - an export that fails is reported, not fatal
                print(f"skip {case.name} ({exporter}): {str(exc).splitlines()[0][:120]}")
                continue
            model = engine.load(data)
            (name,) = model.inputs
            feeds = {name: x.numpy()}
            if model.graph.types[name].is_float:
                xs, zs = [name], []
            else:  # token ids: the embedding's output is the x, the ids its input
                xs, zs = [_embedding(model, name)], []  # the ids still feed masks and positions: fed, not in zs
            yield f"{case.name}/{exporter}", (lambda data=data: engine.load(data)), model.outputs[0], xs, zs, feeds


def _embedding(model, ids: str) -> str:
    """The output of the first Gather of a weight at indices computed from the ids (a Cast may come first)."""
    from_ids = {ids}
    for node in model.graph.nodes:
        if node.op_type == "Gather" and node.input[1] in from_ids and node.input[0] in model.graph.initializers:
            return node.output[0]
        if from_ids.intersection(node.input):
            from_ids.update(node.output)
    raise KeyError(f"no Gather reads {ids!r}")


def chosen_mutants(load, y, xs, zs, feeds, count: int):
    """Up to `count` mutants, one op type after another, each op type's kinds in KINDS order."""
    by_op = collections.defaultdict(list)
    for m in candidates(build(load(), y, xs, zs, feeds, None, 0, "cpu", False)):
        if m.kind in KINDS:
            by_op[m.op_type].append(m)
    picked, queues = [], [sorted(v, key=lambda m: (KINDS.index(m.kind), m.input)) for v in by_op.values()]
    while len(picked) < count and any(queues):
        for q in queues:
            if q and len(picked) < count:
                picked.append(q.pop(0))
    return picked


def one(name, load, y, xs, zs, feeds, count: int) -> dict:
    model = load()
    started = time.monotonic()
    report = engine.check(model, y, xs, zs, feeds=feeds)
    default_s = time.monotonic() - started
    started = time.monotonic()
    fast = engine.check(model, y, xs, zs, feeds=feeds, mode="fast")
    fast_s = time.monotonic() - started
    row = {"model": name, "verdict": report.verdict, "mode": report.mode, "seconds": round(default_s, 2),
           "resolved_by": sorted({r.resolved_by for r in report.results if r.resolved_by}),
           "fast verdict": fast.verdict, "fast seconds": round(fast_s, 2),
           "reasons": [r.reason[:200] for r in report.results if r.status != "pass"]}
    if count:
        mutants = chosen_mutants(load, y, xs, zs, feeds, count)
        m = run_mutants(load, y, xs, zs, feeds, modes=("auto", "fast"), mutants=mutants)
        row.update(mutants=len(mutants), counted=m.counted, auto=m.tally("auto"), fast=m.tally("fast"),
                   survivors=[o.mutant.label for mode in ("auto", "fast") for o in m.survivors(mode)],
                   mutant_seconds={mode: round(sum(o.seconds.get(mode, 0.0) for o in m.outcomes), 1)
                                   for mode in ("auto", "fast")})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=16, help="mutants per model (0: the unmutated check only)")
    ap.add_argument("--only", default="", help="comma-separated model names (prefixes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "mutants_real.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    only = [s for s in args.only.split(",") if s]
    rows = []
    for name, load, y, xs, zs, feeds in (*tool_cases(), *real_cases()):
        if only and not any(name.startswith(o) for o in only):
            continue
        try:
            row = one(name, load, y, xs, zs, feeds, args.mutants)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            row = {"model": name, "error": str(exc).splitlines()[0][:200]}
        rows.append(row)
        print(row, flush=True)
        write_json(args.json, {"torch": torch.__version__, "threads": args.threads, "rows": rows})
    killed = sum(r.get("auto", {}).get(KILLED, 0) for r in rows)
    counted = sum(r.get("counted", 0) for r in rows)
    print(f"{len(rows)} models; default verdicts {collections.Counter(r.get('verdict') for r in rows)}; "
          f"mutants killed by default {killed} of {counted}; survivors "
          f"{[s for r in rows for s in r.get('survivors', [])]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
