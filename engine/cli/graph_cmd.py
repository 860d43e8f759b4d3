"""onnxgrad graph MODEL [--y Y --xs A,B --zs C] [--view ...] -o FILE: draw the forward/backward graph."""
from __future__ import annotations

import os
import sys

from ..errors import OnnxGradError, SelectionError
from .common import (
    Stages,
    add_feed_arguments,
    add_model_argument,
    add_selection_arguments,
    collect_feeds,
    open_model,
    parse_dim_arguments,
    selection_of,
)

VIEWS = ("forward", "backward", "combined")  # engine.graphs.view.VIEWS, spelled out: that import costs onnx


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="draw the forward, backward or combined graph (DOT, SVG, PNG or text)")
    add_model_argument(p)
    add_selection_arguments(p, required=False)
    p.add_argument("--view", choices=VIEWS, default="forward",
                   help="forward, backward or combined (default forward); without --y/--xs the backward "
                        "views draw the model's own Gradient nodes")
    p.add_argument("--collapse-chains", action="store_true", help="fold long linear chains into one node")
    p.add_argument("--stats", action="store_true",
                   help="run the gradient and label backward edges with shape, norm, min, max, NaN/Inf")
    add_feed_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed for the default values of unfed tensors (default 0)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="FILE.dot, FILE.svg, FILE.png (svg/png need Graphviz's dot) or FILE.txt "
                        "(box drawing); default: DOT on stdout")
    p.set_defaults(handler=run)


def run(args) -> int:
    with Stages() as stage:
        return _draw(args, stage)


def _draw(args, stage) -> int:
    from ..graphs.dot import view_to_dot
    from ..graphs.layout import layout_view
    from ..graphs.svg import PLACED_FROM_NODES, render_view
    from ..graphs.terminal import render_text
    from ..graphs.view import build_view

    if bool(args.y) != bool(args.xs):
        raise SelectionError("give --y and --xs together (or neither)")
    if args.stats and not args.y:
        raise SelectionError("--stats needs a selection: give --y and --xs")
    out = args.output
    fmt = os.path.splitext(out)[1].lower() if out else ".dot"
    if fmt not in (".dot", ".gv", ".svg", ".png", ".txt"):
        raise OnnxGradError(f"cannot write {out}: the file name must end in .dot, .svg, .png or .txt")
    stage(f"loading {os.path.basename(args.model)}")
    model = open_model(args)
    spec = selection_of(model, args) if args.y else None
    stats = None
    if args.stats:
        from ..graphs.stats import gradient_with_stats

        stage("computing the gradient for --stats")
        feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
        _, stats = gradient_with_stats(model, spec.y, spec.xs, spec.zs, feeds=feeds, seed=args.seed,
                                       dims=parse_dim_arguments(model, args))
    stage(f"building the {args.view} view")
    view = build_view(model, spec, args.view, stats, collapse_chains=args.collapse_chains,
                      needs_edges=fmt != ".txt")
    placed = ""
    if fmt == ".txt":
        stage(f"laying out {len(view.nodes):,} nodes")
        text = render_text(layout_view(view)) + "\n"
        if stats is not None:  # a box drawing has no edge labels: the stats follow as a table
            text += _stats_table(spec.y, stats)
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
    elif out is None:
        sys.stdout.write(view_to_dot(view))
        return 0
    elif render_view(view, out, progress=stage) == "layered":
        why = f"{PLACED_FROM_NODES} nodes or more" if len(view.nodes) >= PLACED_FROM_NODES else "dot ran out of time"
        placed = f", placed by onnxgrad's layered layout ({why}) and drawn by Graphviz neato"
    print(f"wrote {args.view} view ({len(view.nodes)} nodes, {len(view.edges)} edges) to {out}{placed}")
    return 0


def _stats_table(y: str, stats) -> str:
    width = max((len(n) for n in stats.tensors), default=0)
    rows = [f"  {name:<{width}}  {s.describe() if s is not None else 'no gradient flows here'}"
            for name, s in stats.tensors.items()]
    return f"\ngradient stats, d{y}/d(tensor):\n" + "\n".join(rows) + "\n"
