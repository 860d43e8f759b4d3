"""onnxgrad diff A.onnx B.onnx (or MODEL --dtype float16, MODEL --against onnxruntime): where two versions
of a model part, forward and gradient, node by node (exit 0 nothing diverges, 1 something does, 2 bad input)."""
from __future__ import annotations

import sys

from .check_cmd import _writable
from .common import add_feed_arguments, add_ops_argument, collect_feeds, load_ops, note, parse_dim_arguments, write_json


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="compare two versions of a model node by node, forward and gradient, and name "
                                    "the first node where they part (exit 0 none, 1 diverges, 2 bad input)")
    p.add_argument("model", metavar="A", help="path to an .onnx file (A)")
    p.add_argument("other", metavar="B", nargs="?", default=None,
                   help="the model to compare A with (omit with --dtype or --against)")
    add_ops_argument(p)
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default=None, help="compare A with itself run in this dtype")
    p.add_argument("--against", choices=["onnxruntime"], default=None,
                   help="compare the engine with onnxruntime on A's file (forward only)")
    p.add_argument("--y", default=None, help="the tensor to differentiate (with --xs the gradient is compared too)")
    p.add_argument("--xs", default="", help="comma-separated tensors to differentiate with respect to")
    p.add_argument("--zs", default="", help="comma-separated tensors held fixed; 'inputs' stands for every graph "
                                            "input not in xs")
    add_feed_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed for the made-up feeds")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--sort", choices=["worst", "graph"], default="worst",
                   help="order of the per-node table: worst local error first (default) or graph order")
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows of the per-node table (default 20; 0: all)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (docs/diff.md); - for stdout")
    p.add_argument("--junit", metavar="FILE", help="write the report as JUnit XML")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report: A's graph coloured by divergence, "
                                                 "linked to the per-node table")
    p.add_argument("--node-data", metavar="FILE", help="write the forward divergence as Model Explorer node data (JSON)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from .. import load
    from ..modeldiff.sides import check_form

    for path in (args.json, args.junit, args.html, args.node_data):
        _writable(path)
    check_form(args.other is not None, args.dtype, args.against)
    load_ops(args)
    model = load(args.model)
    from ..modeldiff.compare import diff
    from ..modeldiff.text import culprit_line, junit_xml

    feeds = collect_feeds(model, args, seed=args.seed)
    report = diff(args.model if args.against else model, args.other, y=args.y, xs=args.xs, zs=args.zs, feeds=feeds,
                  dims=parse_dim_arguments(model, args), seed=args.seed, dtype=args.dtype, against=args.against,
                  device=args.device)
    if args.against is None:
        report = _relabel(report, args)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(culprit_line(report), file=out)
    for c in report.culprits[1:]:
        print(culprit_line(report, c, "also"), file=out)
    _table(report, args, out)
    for line in report.notes:
        note(args, line)
    if args.json:
        write_json(args.json, report.to_json())
    if args.junit:
        with open(args.junit, "w") as fh:
            fh.write(junit_xml(report) + "\n")
    _write_views(report, model.graph, args)
    return report.exit_code


def _write_views(report, graph, args) -> None:
    """--html and --node-data: the report for a browser, and for Google's Model Explorer overlay."""
    import json

    if args.html:
        from ..modeldiff.html import report_html

        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(report_html(report, graph))
    if args.node_data:
        from ..modeldiff.node_data import model_explorer_node_data

        with open(args.node_data, "w") as fh:
            json.dump(model_explorer_node_data(report, graph=graph), fh, indent=1)


def _relabel(report, args):
    from dataclasses import replace

    b = args.other if args.other else f"{args.model} as {args.dtype}"
    return replace(report, a=args.model, b=b)


def _table(report, args, out) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = report.worst() if args.sort == "worst" else sorted(report.nodes, key=lambda n: (n.where, n.order))
    if args.top:
        rows = rows[: args.top]
    table = Table(box=None, pad_edge=False)
    for column in ("node", "op", "where", "local error", "tolerance", "error", "", "note"):
        table.add_column(column, justify="right" if "error" in column or column == "tolerance" else "left")
    for n in rows:
        table.add_row(n.node, n.op_type, n.where, f"{n.local_error:.2g}", f"{n.tolerance:.2g}", f"{n.error:.2g}",
                      "DIVERGES" if n.diverges else "ok", n.note)
    console = Console(width=160, highlight=False, color_system=None)
    with console.capture() as captured:
        console.print(table)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()), file=out)
    if len(report.nodes) > len(rows):
        print(f"({len(rows)} of {len(report.nodes)} comparisons shown; --top 0 shows all)", file=out)
