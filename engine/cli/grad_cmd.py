"""onnxgrad grad MODEL --y Y --xs A,B: the Gradient operator from the command line."""
from __future__ import annotations

from .common import (
    add_compile_argument,
    add_device_arguments,
    add_feed_arguments,
    add_model_argument,
    collect_feeds,
    describe,
    open_model,
    parse_dy,
    save_npz,
)


def add_parser(sub) -> None:
    p = sub.add_parser("grad", help="gradients of y with respect to xs (zs held fixed)")
    add_model_argument(p)
    p.add_argument("--y", required=True, help="the tensor to differentiate")
    p.add_argument("--xs", required=True, help="comma-separated tensors to differentiate with respect to")
    p.add_argument("--zs", default="", help="comma-separated tensors held fixed")
    add_feed_arguments(p)
    p.add_argument("--dy", metavar="SPEC", help="seed for a non-scalar y (default: ones, i.e. the gradient of sum(y))")
    p.add_argument("--seed", type=int, default=0, help="seed for the default values of unfed tensors (default 0)")
    add_device_arguments(p)
    p.add_argument("--out", metavar="FILE.npz", help="save the gradients; keys are the xs names")
    add_compile_argument(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    model = open_model(args)
    spec = model.selection(args.y, args.xs, args.zs)
    feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
    dy = parse_dy(model, spec.y, args.dy, args.seed)
    result = model.gradient(spec.y, spec.xs, spec.zs, feeds=feeds, dy=dy, device=args.device,
                            dtype=args.dtype, seed=args.seed)
    print(f"y {spec.y}: {describe(result.y)}  (seed: {'--dy' if dy is not None else 'ones'})")
    for name, g in result.grads.items():
        flag = "  [disconnected: y does not depend on it]" if name in result.disconnected else ""
        print(f"d{spec.y}/d{name}: {describe(g)}{flag}")
    if args.out:
        save_npz(args.out, result.grads)
        print(f"saved {len(result.grads)} gradient(s) to {args.out}")
    return 0
