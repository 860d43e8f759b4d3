"""Regenerate docs/ops.md: op, registered opsets, ONNX node cases passed / total, gradient status.

    python scripts/gen_ops_doc.py                # write docs/ops.md
    python scripts/gen_ops_doc.py --check        # exit 1 when docs/ops.md is not current
    python scripts/gen_ops_doc.py --raise-floor  # also record the pass counts in tests/conformance_floor.json
    python scripts/gen_ops_doc.py --lower        # first re-run the full lowering sweep (minutes) and record it
                                                 # in tests/lowering_floor.json
    python scripts/gen_ops_doc.py --contrib      # also rerun the com.microsoft sweep for its section (minutes)
    python scripts/gen_ops_doc.py --jvp          # first re-run the full gradient and JVP sweeps (20 minutes on
                                                 # 2 busy cores) and record them in tests/jvp_floor.json

The forward columns come from every collected case; the gradient column from the seeded sample that CI
also runs (`engine.conformance.suite.DOC_GRADIENT_SAMPLE` cases per op); the lowered column from the full
lowering sweep recorded in tests/lowering_floor.json (CI re-runs a sample of it); the jvp column from the
full gradient and JVP sweeps recorded in tests/jvp_floor.json (CI re-runs the gradient sample's JVPs).
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "ops.md"
FLOOR = ROOT / "tests" / "conformance_floor.json"
LOWERING_FLOOR = ROOT / "tests" / "lowering_floor.json"
JVP_FLOOR = ROOT / "tests" / "jvp_floor.json"


def floor_from(run, previous: dict | None) -> dict:
    """The floor after `run`; refuses to lower it (a case that passed must keep passing)."""
    from engine.conformance.gradients import ERROR, FAIL

    passing = sorted(o.name for o in run.outcomes if o.status == "pass")
    bad = sum(o.failed for o in run.outcomes)
    grad_pass = sum(g.status == "pass" for g in run.gradients)
    if previous:
        lost = sorted(set(previous.get("passing", [])) - set(passing))
        if lost:
            raise SystemExit(f"not raising the floor: {len(lost)} recorded cases no longer pass, e.g. {lost[:5]}")
        bad = min(bad, previous.get("forward_mismatch_or_error_max", bad))
        grad_pass = max(grad_pass, previous.get("gradient_sample_pass", 0))
    undocumented = sum(g.status in (FAIL, ERROR) and not g.documented for g in run.gradients)
    return {
        "onnx": __import__("onnx").__version__,
        "forward_pass": len(passing),
        "forward_mismatch_or_error_max": bad,
        "gradient_sample_pass": grad_pass,
        "gradient_sample_undocumented_fail_max": undocumented,
        "passing": passing,
    }


def record_lowering(run) -> dict:
    """Run the full lowering sweep over the run's forward-passing cases and record it."""
    from engine.conformance.cases import case_named
    from engine.conformance.lowered import lowering_sweep, sweep_record

    passing = [case_named(o.name) for o in run.outcomes if o.status == "pass"]
    previous = json.loads(LOWERING_FLOOR.read_text()) if LOWERING_FLOOR.exists() else None
    try:
        record = sweep_record(lowering_sweep(passing), previous)
    except ValueError as exc:
        raise SystemExit(f"not recording the lowering sweep: {exc}") from None
    LOWERING_FLOOR.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {LOWERING_FLOOR}: {record['summary']}")
    return record


def record_jvp(run) -> dict:
    """Run the full gradient (VJP) and JVP sweeps over the run's forward-passing cases and record them."""
    from engine.conformance.cases import case_named
    from engine.conformance.gradients import gradient_sweep
    from engine.conformance.jvps import jvp_record, jvp_sweep

    passing = [case_named(o.name) for o in run.outcomes if o.status == "pass"]
    previous = json.loads(JVP_FLOOR.read_text()) if JVP_FLOOR.exists() else None
    try:
        record = jvp_record(gradient_sweep(passing), jvp_sweep(passing), previous)
    except ValueError as exc:
        raise SystemExit(f"not recording the JVP sweep: {exc}") from None
    JVP_FLOOR.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {JVP_FLOOR}: jvp {record['jvp']}, {len(record['exceptions'])} VJP-pass-JVP-not")
    return record


def contrib_section() -> str:
    from engine.conformance.contrib import contrib_sweep
    from engine.conformance.contrib_cases import op_domains, op_oracles
    from engine.conformance.contrib_report import contrib_markdown

    return contrib_markdown(contrib_sweep(gradients=True), op_domains(), op_oracles())


def _section_of(document: str) -> str:
    from engine.conformance.contrib_report import BEGIN, END

    if BEGIN not in document or END not in document:
        return ""
    return BEGIN + document.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n"


def main(argv=None) -> int:
    from engine.conformance.suite import doc_run, render_ops_doc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with docs/ops.md instead of writing it")
    p.add_argument("--raise-floor", action="store_true", help=f"also update {FLOOR.relative_to(ROOT)}")
    p.add_argument("--lower", action="store_true", help=f"re-run the full lowering sweep into {LOWERING_FLOOR.name}")
    p.add_argument("--jvp", action="store_true", help=f"re-run the full gradient and JVP sweeps into {JVP_FLOOR.name}")
    p.add_argument("--contrib", action="store_true",
                   help="also rerun the com.microsoft sweep (forward and gradients) and rewrite its section")
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)
    from engine.conformance.contrib_report import splice

    run = doc_run()
    lowering = record_lowering(run) if args.lower else json.loads(LOWERING_FLOOR.read_text())
    jvp = record_jvp(run) if args.jvp else json.loads(JVP_FLOOR.read_text())
    current = args.out.read_text() if args.out.exists() else ""
    # The contrib section needs onnxruntime and minutes: kept as it is unless --contrib reruns its sweep.
    section = contrib_section() if args.contrib else _section_of(current)
    text = render_ops_doc(run, lowering, jvp)
    text = splice(text, section) if section else text
    if args.check:
        if current == text:
            print(f"{args.out} is current")
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(args.out), "regenerated", lineterm="")
        print("\n".join(list(diff)[:60]))
        print(f"{args.out} is stale: run python scripts/gen_ops_doc.py")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    if args.raise_floor:
        previous = json.loads(FLOOR.read_text()) if FLOOR.exists() else None
        floor = floor_from(run, previous)
        FLOOR.write_text(json.dumps(floor, indent=1) + "\n")
        print(f"wrote {FLOOR}: forward_pass {floor['forward_pass']}, gradient_sample_pass {floor['gradient_sample_pass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
