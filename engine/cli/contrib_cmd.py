"""`onnxgrad conformance --contrib`: the generated com.microsoft cases against onnxruntime."""
from __future__ import annotations

import collections
import sys

from ..errors import OnnxGradError


def select(ops, names, max_cases, per_op):
    from ..conformance.contrib_cases import all_cases

    cases = list(all_cases())
    if ops:
        known = sorted({c.op for c in cases})
        wanted = {o.lower().split("::")[-1] for o in ops}
        unknown = sorted(w for w in wanted if w not in {k.lower() for k in known})
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], known, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else f" (the sweep covers {', '.join(known)})"
            raise OnnxGradError(f"no contrib case tests {', '.join(unknown)}{hint}")
        cases = [c for c in cases if c.op.lower() in wanted]
    if names:
        cases = [c for c in cases if any(n in c.name for n in names)]
    if per_op:
        taken = collections.Counter()
        cases = [c for c in cases if taken.update([c.op]) or taken[c.op] <= per_op]
    if max_cases:
        cases = cases[:max_cases]
    if not cases:
        raise OnnxGradError(f"no contrib case matches --case {' / '.join(names)}")
    return cases


def run_contrib(args, progress) -> int:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise OnnxGradError("--contrib needs onnxruntime, its oracle (pip install onnxruntime)") from None
    from ..conformance.contrib import contrib_sweep, failed
    from ..conformance.contrib_cases import op_domains, op_oracles
    from ..conformance.contrib_report import rows

    if args.max_cases is not None and args.max_cases < 1:
        raise OnnxGradError(f"--max-cases must be at least 1, not {args.max_cases}")
    if args.per_op is not None and args.per_op < 1:
        raise OnnxGradError(f"--per-op must be at least 1, not {args.per_op}")
    cases = select(args.op, args.case, args.max_cases, args.per_op)
    if args.lower:
        return run_contrib_lowering(args, cases, progress)
    run = contrib_sweep(cases, gradients=args.gradients, seed=args.seed, progress=progress)
    out = sys.stdout if args.json != "-" else sys.stderr
    forward = collections.Counter(o.status for o in run.outcomes)
    others = ", ".join(f"{n} {s}" for s, n in sorted(forward.items()) if s != "pass")
    print(f"contrib forward: {forward.get('pass', 0)} / {len(run.outcomes)} pass" + (f" ({others})" if others else "")
          + f"  {run.seconds:.1f}s", file=out)
    if args.gradients:
        grads = collections.Counter(g.status for g in run.gradients)
        print("gradients (float64 finite differences): "
              + ", ".join(f"{n} {s}" for s, n in sorted(grads.items(), key=lambda kv: -kv[1])), file=out)
    for r in sorted(rows(run, op_domains(), op_oracles()), key=lambda r: r.op.lower()):
        f16 = f"{r.float16[0]}/{r.float16[1]}" if r.float16[1] else "–"
        grad = f"  gradient {r.gradient}" if r.gradient else ""
        print(f"  {r.op:<34} float32 {r.float32[0]}/{r.float32[1]}  float16 {f16}{grad}", file=out)
    for o in run.outcomes:
        if args.show == "all" or (args.show == "failures" and o.status != "pass"):
            print(f"  {o.status:<16} {o.name}: {o.message}", file=out)
    for g in run.gradients:
        if args.show == "all" or (args.show == "failures" and g.status != "pass"):
            print(f"  {g.status:<16} {g.name}: {g.reason}", file=out)
    if args.json:
        import json

        from .common import write_json

        write_json(args.json, json.dumps(run.to_json(), indent=1))
    if args.failures:
        bad = [f"- {o.status}: `{o.name}`: {o.message}" for o in run.outcomes if o.status != "pass"]
        bad += [f"- gradient {g.status}: `{g.name}`: {g.reason}" for g in run.gradients if g.status != "pass"]
        with open(args.failures, "w") as fh:
            fh.write("# Contrib sweep failures\n\n" + ("\n".join(bad) if bad else "None.") + "\n")
    return 1 if failed(run) else 0


def run_contrib_lowering(args, cases, progress) -> int:
    """`--contrib --lower`: the cases of ops with an expansion lowered, run by onnxruntime, against the engine."""
    from ..conformance.contrib_lowered import ULPS, contrib_lowering_sweep, expanded_ops
    from ..conformance.status import LOWERED

    if args.gradients:
        raise OnnxGradError("--contrib --lower compares the lowered gradients with the engine's; run --gradients "
                            "(finite differences) on its own")
    if not any(c.op in expanded_ops() for c in cases):
        raise OnnxGradError(f"no selected contrib case has an expansion (those with one: {', '.join(sorted(expanded_ops()))})")
    run = contrib_lowering_sweep(cases, seed=args.seed, progress=progress)
    out = sys.stdout if args.json != "-" else sys.stderr
    status = collections.Counter(o.status for o in run.outcomes)
    others = ", ".join(f"{n} {s}" for s, n in sorted(status.items()) if s != LOWERED)
    print(f"contrib lowered: {status.get(LOWERED, 0)} / {len(run.outcomes)} match the engine within "
          f"{ULPS['float32']} (float32) and {ULPS['float16']} (float16) ulps" + (f" ({others})" if others else "")
          + f"  {run.seconds:.1f}s", file=out)
    for op, cells in run.per_op().items():
        f16 = f"{cells['float16'][0]}/{cells['float16'][1]}" if cells["float16"][1] else "–"
        print(f"  {op:<34} float32 {cells['float32'][0]}/{cells['float32'][1]}  float16 {f16}", file=out)
    for o in run.outcomes:
        if args.show == "all" or (args.show == "failures" and o.status != LOWERED):
            print(f"  {o.status:<16} {o.name}: {o.reason}", file=out)
    if args.json:
        import json

        from .common import write_json

        write_json(args.json, json.dumps(run.to_json(), indent=1))
    if args.failures:
        bad = [f"- {o.status}: `{o.name}`: {o.reason}" for o in run.outcomes if o.status != LOWERED]
        with open(args.failures, "w") as fh:
            fh.write("# Contrib lowering failures\n\n" + ("\n".join(bad) if bad else "None.") + "\n")
    return 1 if run.failed() else 0
