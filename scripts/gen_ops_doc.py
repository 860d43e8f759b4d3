"""Regenerate docs/ops.md: op, registered opsets, ONNX node cases passed / total, gradient status.

    python scripts/gen_ops_doc.py           # write docs/ops.md
    python scripts/gen_ops_doc.py --check   # exit 1 when docs/ops.md is not current

The forward columns come from every collected case; the gradient column from the seeded sample
that CI also runs (`engine.conformance.suite.DOC_GRADIENT_SAMPLE` cases per op).
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "ops.md"


def main(argv=None) -> int:
    from engine.conformance.suite import render_ops_doc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with docs/ops.md instead of writing it")
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)
    text = render_ops_doc()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
