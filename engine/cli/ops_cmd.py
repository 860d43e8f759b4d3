"""onnxgrad ops: what the registry supports."""
from __future__ import annotations

from .common import add_ops_argument, load_ops


def add_parser(sub) -> None:
    p = sub.add_parser("ops", help="list supported ops and opset ranges")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_ops_argument(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from .. import registry
    from ..catalog import builtin_ops

    load_ops(args)
    # The catalog reads the op modules' source, so listing them costs no torch import; once the
    # registry is live (custom ops registered), it is the truth.
    rows = None if registry.builtins_loaded() else builtin_ops()
    if rows is None:
        rows = [{"domain": e.domain, "op_type": e.op_type, "since": e.since, "until": e.until, "note": e.note}
                for e in registry.supported_ops()]
    for r in rows:
        r["domain"] = r["domain"] or "ai.onnx"
    rows.append({"domain": "ai.onnx.preview.training", "op_type": "Gradient", "since": 1, "until": None,
                 "note": "executed by the engine itself"})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        rng = f"{r['since']}+" if r["until"] is None else f"{r['since']}-{r['until']}"
        dom = "" if r["domain"] == "ai.onnx" else f"{r['domain']}::"
        print(f"{dom}{r['op_type']:<28} opset {rng}")
    print(f"{len(rows)} op implementations")
    return 0
