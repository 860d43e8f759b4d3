"""onnxgrad run MODEL: graph outputs, Gradient nodes included."""
from __future__ import annotations

from .common import (
    add_compile_argument,
    add_device_arguments,
    add_feed_arguments,
    add_model_argument,
    collect_feeds,
    describe,
    note,
    open_model,
    save_npz,
)


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the graph and print or save its outputs")
    add_model_argument(p)
    add_feed_arguments(p)
    add_device_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed for the default values of unfed inputs (default 0)")
    p.add_argument("--output", action="append", default=None, metavar="NAME",
                   help="tensor to return (repeatable; default: the graph outputs)")
    p.add_argument("--out", metavar="FILE.npz", help="save the outputs, keyed by tensor name")
    add_compile_argument(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    model = open_model(args)
    targets = args.output or model.outputs
    if not args.output:  # the default outputs: those an unsupported op blocks are skipped, with a note
        blocked = model.blocked(targets, [n.split("=", 1)[0] for n in args.feed] + _npz_names(args))
        for name, i in blocked.items():
            node = model.graph.nodes[i]
            op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            note(args, f"{name} skipped: it needs node {model.graph.node_names[i]!r} ({op}), an op onnxgrad "
                       "cannot run (--ops FILE.py registers it)")
        targets = [t for t in targets if t not in blocked] or targets
    feeds = collect_feeds(model, args, seed=args.seed, targets=targets)
    outputs = model.run(feeds, outputs=targets, device=args.device, dtype=args.dtype)
    for name, value in outputs.items():
        print(f"{name}: {describe(value)}")
    if args.out:
        save_npz(args.out, outputs)
        print(f"saved {len(outputs)} array(s) to {args.out}")
    return 0


def _npz_names(args) -> list[str]:
    if not args.feeds:
        return []
    from ..gradient.feeds import load_npz

    return list(load_npz(args.feeds))
