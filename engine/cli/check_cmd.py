"""onnxgrad check MODEL --y Y --xs A,B: is this gradient right? (a CI gate: exit 0 pass, 1 fail, 3 inconclusive)."""
from __future__ import annotations

import os
import sys

from ..errors import FeedError
from .common import (
    add_compile_argument,
    add_feed_arguments,
    add_model_argument,
    add_selection_arguments,
    collect_feeds,
    open_model,
    parse_dim_arguments,
    parse_dy,
    selection_of,
    write_json,
)

EXIT = {"pass": 0, "fail": 1, "inconclusive": 3, "cancelled": 3}


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="cross-check gradients against float64 finite differences "
                                     "(exit 0 pass, 1 fail, 3 inconclusive only, 2 bad input)")
    add_model_argument(p)
    add_selection_arguments(p)
    add_feed_arguments(p)
    p.add_argument("--dy", metavar="SPEC", help="seed for a non-scalar y (default: random, seeded by --seed; "
                                                "ones when --claimed is given)")
    p.add_argument("--mode", choices=["auto", "full", "sample", "fast"], default="auto",
                   help="full: every element; sample: --samples random elements per x; "
                        "fast: --directions random directions per x and the gradient's own; "
                        "auto (default): full where affordable, else fast")
    p.add_argument("--samples", type=int, default=None, metavar="N", help="elements per x in sample mode (64)")
    p.add_argument("--directions", type=int, default=None, metavar="K", help="directions per x in fast mode (1)")
    p.add_argument("--order", type=int, choices=[1, 2], default=1, help="2 also checks the gradient of the gradient")
    p.add_argument("--second-order", choices=["gradgrad", "hvp"], default="gradgrad",
                   help="with --order 2: gradgrad (default) differentiates the gradient through create_graph, "
                        "item by item of the mode; hvp takes H·v along a random direction per x by forward "
                        "over reverse")
    p.add_argument("--forward", action="store_true",
                   help="also check forward mode: J·v against central differences along a random v, and "
                        "<u, J·v> = <Jᵀu, v> against reverse mode")
    p.add_argument("--claimed", action="append", default=[], metavar="X=OUT",
                   help="check model output OUT as the gradient of y with respect to X (repeatable)")
    p.add_argument("--per-node", action="store_true",
                   help="check every node on the y<-xs path alone (automatic after a failure)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-4)")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance (default: 1e-6 times each x's gradient scale)")
    p.add_argument("--seed", type=int, default=0, help="seed for random values, dy, samples and directions")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="stop perturbing after S seconds; what was checked is a random sample")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (docs/check-json.md); - for stdout")
    p.add_argument("--junit", metavar="FILE", help="write the report as JUnit XML")
    add_compile_argument(p)
    p.set_defaults(handler=run)


def _writable(path: str | None) -> None:
    if path and path != "-":
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FeedError(f"cannot write {path}: folder {folder} does not exist")


def run(args) -> int:
    _writable(args.json)
    _writable(args.junit)
    model = open_model(args)
    from ..verify import check  # after the model: an unreadable file is refused without torch

    spec = selection_of(model, args)
    feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
    dy = parse_dy(model, spec.y, args.dy, args.seed)
    with _progress_bar() as progress:
        report = check(model, spec.y, spec.xs, spec.zs, feeds=feeds, dy=dy, mode=args.mode, order=args.order,
                       claimed=args.claimed or None, rtol=args.rtol, atol=args.atol, seed=args.seed,
                       per_node=args.per_node, samples=args.samples, directions=args.directions,
                       time_budget=args.time_budget, device=args.device, progress=progress,
                       dims=parse_dim_arguments(model, args), forward=args.forward,
                       second_order=args.second_order)
    text_out = sys.stderr if args.json == "-" else sys.stdout
    print(report.summary(), file=text_out)
    if args.json:
        write_json(args.json, report.to_json())
    if args.junit:
        with open(args.junit, "w") as fh:
            fh.write(report.to_junit() + "\n")
    return EXIT[report.verdict]


class _progress_bar:
    """A rich progress bar with ETA on stderr when it is a terminal; otherwise nothing."""

    def __enter__(self):
        if not sys.stderr.isatty():
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self._bar.start()
        self._task = self._bar.add_task("preparing", total=None)

        def update(done: int, total: int, stage: str) -> None:
            self._bar.update(self._task, completed=done, total=total, description=stage)

        return update

    def __exit__(self, *exc):
        if getattr(self, "_bar", None) is not None:
            self._bar.stop()
        return False
