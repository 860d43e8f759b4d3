"""onnxgrad conformance: ONNX's own node test cases through the engine, and their gradients."""
from __future__ import annotations

import sys

from ..errors import OnnxGradError


def add_parser(sub) -> None:
    p = sub.add_parser("conformance", help="run ONNX's node test cases (forward, and optionally gradients)")
    p.add_argument("--op", action="append", default=[], metavar="OP",
                   help="only cases testing this op (repeatable; case-insensitive)")
    p.add_argument("--case", action="append", default=[], metavar="TEXT",
                   help="only cases whose name contains TEXT (repeatable)")
    p.add_argument("--max-cases", type=int, metavar="N", help="stop after the first N selected cases")
    p.add_argument("--contrib", action="store_true",
                   help="run the generated com.microsoft cases (onnxruntime's contrib ops) against onnxruntime "
                        "instead: float32 and float16 forward, and gradients with --gradients")
    p.add_argument("--gradients", action="store_true",
                   help="also check each forward-passing case's differentiable inputs against finite differences")
    p.add_argument("--jvp", action="store_true",
                   help="also check each forward-passing case's J·v (forward mode, float64) against central "
                        "differences along a random v and against reverse mode (<u, Jv> = <Jᵀu, v>); with "
                        "--gradients, list the cases whose VJP check passes and JVP check does not")
    p.add_argument("--lower", action="store_true",
                   help="also lower each forward-passing case's gradients to plain ONNX (engine.lower), run them in "
                        "onnxruntime and compare with the engine; with --contrib, instead of the forward sweep: "
                        "every case of an op with an expansion, float32 and float16")
    p.add_argument("--per-op", type=int, metavar="K",
                   help="with --gradients, --jvp or --lower: check at most K cases per op (a quicker sample)")
    p.add_argument("--dtype", choices=["float16", "bfloat16"],
                   help="run each float32 case's variant in this type instead (inputs rounded, expected values "
                        "from onnx.reference; with --gradients, the gradient in this type against float64)")
    p.add_argument("--seed", type=int, default=0, help="seed for dy and sampled elements (default 0)")
    p.add_argument("--json", metavar="FILE", help="write every outcome as JSON ('-' for stdout)")
    p.add_argument("--failures", metavar="FILE.md", help="write the failing cases per op as Markdown")
    p.add_argument("--show", choices=["failures", "all", "none"], default="failures",
                   help="which cases to list (default: mismatches, errors and gradient failures)")
    p.add_argument("--slowest", type=int, default=5, metavar="N", help="list the N slowest cases (default 5)")
    from .mutants_cmd import add_arguments

    add_arguments(p)
    p.set_defaults(handler=run)


def _progress():
    if not sys.stderr.isatty():
        return None

    def show(stage: str, i: int, n: int, outcome) -> None:
        end = "\n" if i == n else ""
        sys.stderr.write(f"\r{stage}: {i}/{n} {outcome.name[:60]:<60}{end}")
        sys.stderr.flush()

    return show


def run(args) -> int:
    from ..conformance.report import failures_markdown
    from ..conformance.suite import conformance, sample_per_op

    if args.mutants is not None:
        from .mutants_cmd import run_mutants_command

        return run_mutants_command(args)
    if args.contrib and args.dtype:
        raise OnnxGradError("--dtype makes variants of onnx's node cases; --contrib runs float32 and float16 already")
    if args.contrib:
        from .contrib_cmd import run_contrib

        return run_contrib(args, _progress())
    _refuse_node_case_options(args)
    cases, checker = _cases_and_checker(args)
    sample = (lambda cs: sample_per_op(cs, args.per_op, args.seed)) if args.per_op else None
    result = conformance(cases, gradients=args.gradients, seed=args.seed, progress=_progress(), checker=checker,
                         gradient_filter=sample, lower=args.lower, jvp=args.jvp)
    out = sys.stdout if args.json != "-" else sys.stderr
    _report_forward(result, args.show, out)
    bad_gradient = _report_gradients(result, args.show, out) if args.gradients else 0
    bad_lowering = _report_lowering(result, args.show, out) if args.lower else 0
    bad_jvp = _report_jvps(result, args.show, out) if args.jvp else 0
    if args.slowest:
        timed = sorted([(o, "forward") for o in result.outcomes] + [(o, "gradient") for o in result.gradients]
                       + [(o, "lowering") for o in result.lowered] + [(o, "jvp") for o in result.jvps],
                       key=lambda p: -p[0].seconds)[: args.slowest]
        print("slowest: " + ", ".join(f"{o.name} ({kind}) {o.seconds:.2f}s" for o, kind in timed), file=out)
    if args.json:
        import json

        from .common import write_json

        write_json(args.json, json.dumps(result.to_json(), indent=1))
    if args.failures:
        with open(args.failures, "w") as fh:
            fh.write(failures_markdown(result.outcomes, gradients=result.gradients))
    return 1 if (any(o.failed for o in result.outcomes) or bad_gradient or bad_lowering or bad_jvp) else 0


def _refuse_node_case_options(args) -> None:
    """The node-case sweep's option errors, before any case runs."""
    if args.max_cases is not None and args.max_cases < 1:
        raise OnnxGradError(f"--max-cases must be at least 1, not {args.max_cases}")
    if args.per_op is not None and (args.per_op < 1 or not (args.gradients or args.lower or args.jvp)):
        raise OnnxGradError("--per-op needs --gradients, --jvp or --lower and a count of at least 1")
    if args.jvp and args.dtype:
        raise OnnxGradError("--jvp checks forward mode in float64; --dtype runs float16/bfloat16 variants "
                            "(use one or the other)")
    if args.lower and args.dtype:
        raise OnnxGradError("--lower compares float32 cases; --dtype runs float16/bfloat16 variants (use one or the other)")
    if args.lower:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise OnnxGradError("--lower runs the lowered models in onnxruntime: pip install onnxruntime") from None


def _cases_and_checker(args):
    """The selected node cases (their --dtype variants, checked in that dtype, when asked) and the
    gradient checker (None: the sweep's default)."""
    from ..conformance import select_cases

    cases = select_cases(args.op, args.case, None if args.dtype else args.max_cases)
    if not cases:
        raise OnnxGradError(f"no node test case matches --case {' / '.join(args.case)}")
    if not args.dtype:
        return cases, None
    from ..conformance.variants import variants_of
    from ..conformance.verifier import native_check

    cases = variants_of(cases, args.dtype)[: args.max_cases]
    if not cases:
        raise OnnxGradError(f"none of the selected cases has a {args.dtype} variant")
    return cases, native_check


def _report_forward(result, show: str, out) -> None:
    """Print the forward totals and the cases `show` asks for."""
    from ..conformance.report import counts, localize
    from ..conformance.status import ERROR, MISMATCH, PASS

    c = counts(result.outcomes)
    print(f"forward: {c[PASS]} / {len(result.outcomes)} pass  ("
          + ", ".join(f"{n} {s}" for s, n in c.items() if s != PASS) + f")  {result.forward_seconds:.1f}s", file=out)
    for o in result.outcomes:
        if show == "all" or (show == "failures" and o.status in (MISMATCH, ERROR)):
            accepted = f" (documented: {o.documented})" if o.documented else ""
            print(f"  {o.status:<16} {o.name}: {o.message}{accepted}", file=out)
            if o.status == MISMATCH and len(o.ops) > 1:
                print(f"  {'':<16} {localize(o)}", file=out)


def _report_gradients(result, show: str, out) -> int:
    """Print the gradient sweep's totals and cases; the number of undocumented fail or error cases."""
    from ..conformance.status import ERROR, FAIL, INCONCLUSIVE, NONFINITE

    g: dict[str, int] = {}
    for o in result.gradients:
        g[o.status] = g.get(o.status, 0) + 1
    print(f"gradients ({result.checker}): " + ", ".join(f"{n} {s}" for s, n in sorted(g.items(), key=lambda kv: -kv[1]))
          + f"  {result.gradient_seconds:.1f}s", file=out)
    bad = 0
    for o in result.gradients:
        failing = o.status in (FAIL, ERROR, NONFINITE)
        bad += o.status in (FAIL, ERROR) and not o.documented
        if show == "all" or (show == "failures" and (failing or o.status == INCONCLUSIVE)):
            accepted = f" (documented: {o.documented})" if o.documented else ""
            print(f"  {o.status:<16} {o.name}: {o.reason}{accepted}", file=out)
    return bad


def _report_lowering(result, show: str, out) -> int:
    """Print the lowering sweep's totals and cases; the number of undocumented wrong or error cases."""
    from ..conformance.status import ERROR, LOWERED, WRONG

    applicable = [o for o in result.lowered if o.applicable]
    counts: dict[str, int] = {}
    for o in applicable:
        counts[o.status] = counts.get(o.status, 0) + 1
    lowered = counts.pop(LOWERED, 0)
    others = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"lowered: {lowered} / {len(applicable)} cases whose gradient the engine computes"
          + (f" ({others})" if others else "") + f"  {result.lowered_seconds:.1f}s", file=out)
    bad = 0
    for o in applicable:
        failing = o.status in (WRONG, ERROR) and not o.documented
        bad += failing
        if show == "all" or (show == "failures" and o.status != LOWERED):
            accepted = f" (documented: {o.documented})" if o.documented else ""
            print(f"  {o.status:<16} {o.name}: {o.reason}{accepted}", file=out)
    return bad


def _report_jvps(result, show: str, out) -> int:
    """Print the JVP sweep's totals and cases, and (with gradients) the cases whose VJP passes and JVP
    does not; the number of undocumented fail or error cases plus undocumented such exceptions."""
    from ..conformance.jvps import rule_exceptions
    from ..conformance.status import ERROR, FAIL, INCONCLUSIVE, NO_FORWARD_RULE, NONFINITE

    counts: dict[str, int] = {}
    for o in result.jvps:
        counts[o.status] = counts.get(o.status, 0) + 1
    print("jvp: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
          + f"  {result.jvp_seconds:.1f}s", file=out)
    bad = 0
    for o in result.jvps:
        failing = o.status in (FAIL, ERROR, NONFINITE, NO_FORWARD_RULE)
        bad += o.status in (FAIL, ERROR) and not o.documented
        if show == "all" or (show == "failures" and (failing or o.status == INCONCLUSIVE)):
            accepted = f" (documented: {o.documented})" if o.documented else ""
            print(f"  {o.status:<16} {o.name}: {o.reason}{accepted}", file=out)
    if result.gradients:
        exceptions = rule_exceptions(result.gradients, result.jvps)
        print(f"VJP passes, JVP does not: {len(exceptions)} of {sum(g.status == 'pass' for g in result.gradients)} "
              "cases", file=out)
        for _, j in exceptions:
            accepted = f" (documented: {j.documented})" if j.documented else ""
            print(f"  {j.status:<16} {j.name}: {j.reason}{accepted}", file=out)
        bad += sum(not j.documented for _, j in exceptions)
    return bad
