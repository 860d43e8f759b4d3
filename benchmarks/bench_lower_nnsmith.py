"""NNSmith's random graphs lowered: per precision, how many selections' lowered gradients (onnxruntime,
graph optimizations off) match torch autograd through NNSmith's own module, are refused, give NaN, or
cannot run for want of an onnxruntime kernel (tests/nnsmith_lowering.py says how each is judged).

    python benchmarks/bench_lower_nnsmith.py [--graphs 300] [--dtypes float16,float32,float64] [--start 0] [--optimize]

Results (counts, and every selection that did not match) go to benchmarks/results/lower_nnsmith.json. The
process caps its address space (--memory-gb, default 6): a few graphs draw kernels so large that torch or
onnxruntime would take tens of GB, and those count as errors rather than take the machine down.
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _results import write_json  # noqa: E402


def sweep(dtype: str, seeds, optimize: bool = False, log=print) -> dict:
    from tests import nnsmith_graphs as ng
    from tests import nnsmith_lowering as nl

    counts, others, graphs, start = collections.Counter(), [], 0, time.perf_counter()
    for seed in seeds:
        graph = ng.generate(seed, dtypes=(dtype,))
        if graph is None:
            counts["no graph"] += 1
            continue
        graphs += 1
        try:
            outcomes = nl.lowered_outcomes(graph, optimize=optimize)
        except Exception as exc:  # noqa: BLE001 - torch or onnxruntime out of memory, and anything else: counted
            outcomes = [nl.Outcome(seed, "?", "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")]
        for o in outcomes:
            counts[o.status] += 1
            if o.status != nl.MATCHED:
                others.append({"seed": o.seed, "y": o.y, "status": o.status, "detail": o.detail, "graph_dtype": graph.dtype})
    result = {"graphs": graphs, "selections": sum(v for k, v in counts.items() if k != "no graph"),
              "counts": dict(counts), "seconds": round(time.perf_counter() - start, 1), "not_matched": others}
    log(f"{dtype}: {graphs} graphs, {dict(counts)}, {result['seconds']} s")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=300)
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--dtypes", default="float16,float32,float64")
    ap.add_argument("--memory-gb", type=float, default=6.0)
    ap.add_argument("--optimize", action="store_true", help="onnxruntime's graph optimizations on (default off)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "lower_nnsmith.json"))
    args = ap.parse_args()
    cap = int(args.memory_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import onnxruntime as ort
    import torch

    results = {"seeds": [args.start, args.start + args.graphs], "onnxruntime": ort.__version__,
               "torch": torch.__version__, "graph_optimizations": args.optimize, "dtypes": {}}
    for dtype in args.dtypes.split(","):
        results["dtypes"][dtype] = sweep(dtype, range(args.start, args.start + args.graphs), args.optimize)
        write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
