"""The long load-path fuzz (issue 35): 100,000 mutated sample models, half byte-level and half proto-level
(tests/load_fuzz.py's mutations, attributes included), loaded, run and differentiated with NO memory limit.

Children run the cases: each takes a slice of the seeded case list, runs its cases in sequence and writes
one JSON line per case. A child that dies (a signal, the kernel's OOM killer, a segfault) costs the case it
was on, counted as a kill, and a new child goes on from the next case; a case that sends no line within
--timeout seconds is a hang: its child is killed, and the same. Children set their oom_score_adj to 1000, so
an OOM kill picks a child, not the session that started the run. Every case's line goes to OUT/cases.jsonl;
a run started again with the same OUT goes on after the last case recorded there.

    nice -n 10 python benchmarks/fuzz_models.py --cases 100000 --out /tmp/fuzz100k \\
        [--seed 35] [--slice 2000] [--timeout 300] [--models GLOB ...] [--json benchmarks/results/fuzz_models.json]

Outcomes: 'refused' (load failed, one line), 'unfed' (loaded; an input the fuzz cannot feed, so not run),
'loaded' (loaded and run; run and gradient each 'ok' or the name of their one-line error), 'escape'
(anything else: not an OnnxGradError, or not one line), 'kill', 'hang'.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import select
import subprocess
import sys
import time
import traceback
import warnings
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child(start: int, end: int, n_bytes: int, n_protos: int, seed: int, models: tuple[str, ...] = ()) -> int:
    """Run cases start..end-1 of the case list, one JSON line each, flushed as each ends."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:  # not Linux: nothing to tell an OOM killer
        pass
    warnings.simplefilter("ignore")
    from tests import load_fuzz

    originals = load_fuzz.sample_models(models)
    cases = load_fuzz.case_list(n_bytes, n_protos, seed)
    for i in range(start, end):
        kind, k, case_seed = cases[i]
        name, data = load_fuzz.mutant(originals, kind, k, case_seed)
        record = {"i": i, "kind": kind, "model": name, **exercise(data)}
        record["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
    return 0


def exercise(data: bytes) -> dict:
    """load_fuzz.exercise, stage by stage: what each stage did, or the escape and where it was raised."""
    import engine
    from engine.errors import OnnxGradError
    from tests import load_fuzz

    stage = "load"
    try:
        try:
            model = engine.load(data)
        except OnnxGradError as exc:
            load_fuzz._one_line(exc)
            return {"outcome": "refused", "error": type(exc).__name__}
        feeds = load_fuzz.feeds_for(model)
        if feeds is None:
            return {"outcome": "unfed"}
        out = {"outcome": "loaded"}
        for stage, call in (("run", load_fuzz._run), ("gradient", load_fuzz._gradient)):
            try:
                call(model, feeds)
                out[stage] = "ok"
            except OnnxGradError as exc:
                load_fuzz._one_line(exc)
                out[stage] = type(exc).__name__
        return out
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - an escape: say what and where, go on
        text = str(exc).strip()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "escape", "stage": stage,
                "message": f"{type(exc).__name__}: {text.splitlines()[0][:240] if text else ''}",
                "at": f"{os.path.relpath(where.filename, ROOT)}:{where.lineno}"}


def drive(args) -> dict:
    """Start children over the case list until every case has a line in OUT/cases.jsonl."""
    os.makedirs(args.out, exist_ok=True)
    lines_path = os.path.join(args.out, "cases.jsonl")
    from tests import load_fuzz

    names = [name for name, _ in load_fuzz.sample_models(tuple(args.models))]
    cases = load_fuzz.case_list(args.cases // 2, args.cases - args.cases // 2, args.seed)

    def describe(i: int) -> dict:
        return {"kind": cases[i][0], "model": names[cases[i][1] % len(names)]}

    done = _recorded(lines_path)
    begun = time.time()
    with open(lines_path, "a") as lines, open(os.path.join(args.out, "children.stderr"), "a") as errors:
        next_case = max(done, default=-1) + 1
        while next_case < args.cases:
            end = min(next_case + args.slice, args.cases)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", str(next_case), str(end),
                   "--cases", str(args.cases), "--seed", str(args.seed), "--models", *args.models]
            next_case = run_child(cmd, next_case, end, args.timeout, describe, lines, errors)
    return summarize(lines_path, args, time.time() - begun)


def run_child(cmd: list[str], start: int, end: int, timeout: float, describe: Callable[[int], dict], lines, errors,
              startup: float = 60) -> int:
    """One child over cases start..end-1, its lines copied to `lines` and a line written for the case it died
    or hung on (`describe` gives its kind and model); returns the case to go on from (after a kill or a hang,
    the next one)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, env=env, cwd=ROOT)
    expected, buffer = start, b""
    deadline = time.time() + timeout + startup  # the first case also waits for the child's imports
    while expected < end:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
        if not ready:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            _write(lines, {"i": expected, **describe(expected), "outcome": "hang",
                           "message": f"no result after {timeout} s"})
            return expected + 1
        chunk = os.read(proc.stdout.fileno(), 1 << 16)
        if not chunk:
            rc = proc.wait()
            proc.stdout.close()
            _write(lines, {"i": expected, **describe(expected), "outcome": "kill",
                           "message": f"child exit {rc}" + (f" (signal {-rc})" if rc < 0 else "")})
            return expected + 1
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            try:
                expected = json.loads(line)["i"] + 1
            except (ValueError, KeyError, TypeError):  # something in the child printed to stdout: not a result
                errors.write(f"child stdout: {line[:500]!r}\n")
                continue
            lines.write(line.decode() + "\n")
            deadline = time.time() + timeout
        lines.flush()
    proc.stdout.close()
    proc.wait()
    return end


def _write(lines, record: dict) -> None:
    lines.write(json.dumps(record) + "\n")
    lines.flush()


def _recorded(path: str) -> set[int]:
    if not os.path.exists(path):
        return set()
    with open(path) as fh:
        return {json.loads(line)["i"] for line in fh if line.strip()}


def summarize(lines_path: str, args, seconds: float) -> dict:
    with open(lines_path) as fh:
        records = {r["i"]: r for r in map(json.loads, filter(str.strip, fh))}  # a case once, however many runs
    counts = collections.Counter(r["outcome"] for r in records.values())
    by_kind = {kind: dict(collections.Counter(r["outcome"] for r in records.values() if r["kind"] == kind))
               for kind in ("bytes", "proto")}
    stages = {stage: dict(collections.Counter(r[stage] for r in records.values() if stage in r))
              for stage in ("run", "gradient")}
    refusals = collections.Counter(r["error"] for r in records.values() if r["outcome"] == "refused")
    peak = max(records.values(), key=lambda r: r.get("rss_kb", 0), default={})
    findings = {kind: [_finding(r) for r in records.values() if r["outcome"] == kind]
                for kind in ("escape", "kill", "hang")}
    return {"cases": len(records), "planned": args.cases, "seed": args.seed, "models": args.models or "sample_models/*.onnx",
            "memory_limit": None,
            "byte_level": sum(r["kind"] == "bytes" for r in records.values()),
            "proto_level": sum(r["kind"] == "proto" for r in records.values()),
            "outcomes": {k: counts.get(k, 0) for k in ("refused", "unfed", "loaded", "escape", "kill", "hang")},
            "by_kind": by_kind, "stages": stages, "refused_by": dict(refusals.most_common()),
            "escapes": findings["escape"], "kills": findings["kill"], "hangs": findings["hang"],
            "peak_child_rss_mb": round(peak.get("rss_kb", 0) / 1024, 1), "peak_child_rss_case": peak.get("i"),
            "peak_rss_mb_any_child_this_run": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "seconds_this_run": round(seconds, 1), "machine": _machine(), "commit": _commit()}


def _finding(r: dict) -> str:
    return f"case {r['i']} ({r['kind']}, {r.get('model', '?')}): {r.get('stage', '')} {r['message']} {r.get('at', '')}"


def _commit() -> str:
    """HEAD, marked when engine/ differs from it (the children ran the working tree)."""
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" + uncommitted engine/ changes" if git("status", "--short", "engine") else "")


def _machine() -> str:
    mem = next((line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")), "0")
    return f"{platform.machine()}, {os.cpu_count()} cores, {int(mem) // 2**20} GiB, Python {platform.python_version()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000, help="half byte-level, half proto-level")
    p.add_argument("--seed", type=int, default=35)
    p.add_argument("--out", default="/tmp/fuzz_models", help="where cases.jsonl and the children's stderr go")
    p.add_argument("--slice", type=int, default=2000, help="cases per child")
    p.add_argument("--timeout", type=float, default=300, help="seconds a case may take before it is a hang (a "
                   "legitimate 6 GB Tile and its gradient take 100 s on 2 loaded cores)")
    p.add_argument("--json", default="", help="also write the summary here (benchmarks/results/fuzz_models.json)")
    p.add_argument("--models", nargs="*", default=[], help="glob patterns of the models to mutate (default: "
                   "sample_models/*.onnx; ** recurses)")
    p.add_argument("--child", nargs=2, type=int, metavar=("START", "END"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child, args.cases // 2, args.cases - args.cases // 2, args.seed, tuple(args.models))
    result = drive(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
