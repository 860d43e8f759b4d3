"""ONNX node-test conformance: the engine and onnxruntime side by side, same runner, same tolerances.

    python benchmarks/conformance_ort.py [--op OP ...] [--repeat 3] [--json FILE] [--failures FILE.md]

Prints per-status counts for both backends, the cases only one of them passes, the median wall
time of the whole sweep for each (same process, alternating runs), and the slowest cases.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.conformance import (  # noqa: E402
    ERROR,
    PASS,
    STATUSES,
    UNSUPPORTED_OP,
    UNSUPPORTED_TYPE,
    EngineExecutor,
    run_suite,
    select_cases,
)
from engine.conformance.report import failures_markdown  # noqa: E402


class OrtExecutor:
    """onnxruntime's CPU provider behind the runner's Executor protocol."""

    name = "onnxruntime"

    def __init__(self):
        import onnxruntime as ort

        self.ort = ort
        self.options = ort.SessionOptions()
        self.options.log_severity_level = 4  # its warnings would drown the report

    def prepare(self, model):
        session = self.ort.InferenceSession(model.SerializeToString(), self.options,
                                            providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(inputs):
            return session.run(None, dict(zip(names, inputs)))

        return run

    def classify(self, exc: BaseException) -> str:
        kind = type(exc).__name__
        text = str(exc)
        if kind == "NotImplemented" or "NOT_IMPLEMENTED" in text or "not implemented" in text.lower():
            return UNSUPPORTED_OP
        if ("Opset" in text and ("not supported" in text or "under development" in text)) \
                or "is not a registered function/op" in text:
            return UNSUPPORTED_OP
        if "can't be converted to MLDataType" in text or "No corresponding Numpy type" in text:
            return UNSUPPORTED_TYPE  # its Python binding cannot take ml_dtypes arrays (float8, int4...)
        if "Type Error" in text or "Unexpected input data type" in text or "unsupported type" in text.lower():
            return UNSUPPORTED_TYPE
        return ERROR


def counts(outcomes) -> dict[str, int]:
    c = collections.Counter(o.status for o in outcomes)
    return {s: c.get(s, 0) for s in STATUSES}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", action="append", default=[], help="only cases testing this op (repeatable)")
    p.add_argument("--repeat", type=int, default=1, help="sweeps per backend for the timing median")
    p.add_argument("--json", help="write both backends' outcomes here")
    p.add_argument("--failures", help="write the engine's failing cases, per op, as Markdown here")
    p.add_argument("--slowest", type=int, default=10)
    p.add_argument("--gradients", action="store_true",
                   help="also run the engine's gradient sweep over its passing cases (for --failures)")
    args = p.parse_args(argv)

    cases = select_cases(args.op)
    executors = [EngineExecutor(), OrtExecutor()]
    times = {e.name: [] for e in executors}
    outcomes = {}
    for _ in range(max(1, args.repeat)):
        for ex in executors:
            start = time.perf_counter()
            outcomes[ex.name] = run_suite(cases, ex)
            times[ex.name].append(time.perf_counter() - start)

    eng, ort = outcomes["onnxgrad"], outcomes["onnxruntime"]
    print(f"{len(cases)} node test cases (onnx {__import__('onnx').__version__}, "
          f"onnxruntime {__import__('onnxruntime').__version__})")
    print(f"{'backend':<12}" + "".join(f"{s:>18}" for s in STATUSES) + f"{'sweep s (median)':>20}")
    for name, res in outcomes.items():
        c = counts(res)
        print(f"{name:<12}" + "".join(f"{c[s]:>18}" for s in STATUSES)
              + f"{statistics.median(times[name]):>20.2f}")
    by_name = {o.name: o for o in ort}
    only_ort = [o for o in eng if o.status != PASS and by_name[o.name].status == PASS]
    only_eng = [o for o in eng if o.status == PASS and by_name[o.name].status != PASS]
    both = sum(1 for o in eng if o.status == PASS and by_name[o.name].status == PASS)
    print(f"both pass {both}; only onnxgrad {len(only_eng)}; only onnxruntime {len(only_ort)}")
    reasons = collections.Counter(o.status for o in only_ort)
    print("onnxgrad's status where only onnxruntime passes:", dict(reasons))
    print("slowest onnxgrad cases: " + ", ".join(
        f"{o.name} {o.seconds * 1e3:.0f} ms" for o in sorted(eng, key=lambda o: -o.seconds)[: args.slowest]))
    grads = []
    if args.gradients:
        from engine.conformance import case_named
        from engine.conformance.gradients import gradient_sweep
        from engine.conformance.verifier import default_checker

        checker_name, checker = default_checker()
        start = time.perf_counter()
        grads = gradient_sweep([case_named(o.name) for o in eng if o.status == PASS], checker)
        gc = collections.Counter((g.status, bool(g.documented)) for g in grads)
        print(f"gradient sweep ({checker_name}) {time.perf_counter() - start:.1f}s: " + ", ".join(
            f"{n} {s}{' (documented)' if d else ''}" for (s, d), n in gc.most_common()))
        print("slowest gradient cases: " + ", ".join(
            f"{g.name} {g.seconds:.2f}s" for g in sorted(grads, key=lambda g: -g.seconds)[: args.slowest]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cases": len(cases),
            "counts": {n: counts(r) for n, r in outcomes.items()},
            "sweep_seconds": {n: t for n, t in times.items()},
            "outcomes": {n: [o.to_json() for o in r] for n, r in outcomes.items()},
            "gradients": [g.to_json() for g in grads],
        }, indent=1))
    if args.failures:
        text = failures_markdown(eng, peer=ort, gradients=grads)
        how = ("Regenerate with `python benchmarks/conformance_ort.py --gradients --failures FILE`; "
               "`onnxgrad conformance --op OP --gradients` reruns one op.")
        title, _, rest = text.partition("\n")
        Path(args.failures).write_text(f"{title}\n\n{how}\n{rest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
