"""onnxgrad grad MODEL --y Y --xs A,B: the Gradient operator from the command line."""
from __future__ import annotations

from .common import (
    add_compile_argument,
    add_device_arguments,
    add_feed_arguments,
    add_model_argument,
    add_selection_arguments,
    collect_feeds,
    describe,
    note,
    open_model,
    parse_dim_arguments,
    parse_dy,
    save_npz,
    selection_of,
)


def add_parser(sub) -> None:
    p = sub.add_parser("grad", help="gradients of y with respect to xs (zs held fixed)")
    add_model_argument(p)
    add_selection_arguments(p)
    add_feed_arguments(p)
    p.add_argument("--dy", metavar="SPEC", help="seed for a non-scalar y (default: ones, i.e. the gradient of sum(y))")
    p.add_argument("--seed", type=int, default=0, help="seed for the default values of unfed tensors (default 0)")
    add_device_arguments(p)
    p.add_argument("--hvp", metavar="SPEC", help="also H·v for a scalar y, by forward over reverse, along v: "
                   "random (seeded by --seed), ones, or FILE.npz keyed by x name")
    p.add_argument("--out", metavar="FILE.npz", help="save the gradients; keys are the xs names (H·v: hvp:NAME)")
    add_compile_argument(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import numpy as np

    model = open_model(args)
    spec = selection_of(model, args)
    feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
    dy = parse_dy(model, spec.y, args.dy, args.seed)
    dims = parse_dim_arguments(model, args)
    if args.hvp is not None:
        return _with_hvp(model, spec, feeds, dy, dims, args)
    result = model.gradient(spec.y, spec.xs, spec.zs, feeds=feeds, dy=dy, device=args.device,
                            dtype=args.dtype, seed=args.seed, dims=dims)
    print(f"y {spec.y}: {describe(result.y)}  (seed: {'--dy' if dy is not None else 'ones'})")
    for name, g in result.grads.items():
        flag = "  [disconnected: y does not depend on it]" if name in result.disconnected else ""
        print(f"d{spec.y}/d{name}: {describe(g)}{flag}")
    if args.out:
        save_npz(args.out, result.grads)
        print(f"saved {len(result.grads)} gradient(s) to {args.out}")
    if not all(np.isfinite(g).all() for g in result.grads.values() if g.dtype.kind == "f"):
        from ..verify.findings import nonfinite_origin

        origin = nonfinite_origin(model, spec.y, spec.xs, spec.zs, feeds, dy, device=args.device, dtype=args.dtype,
                                  seed=args.seed, dims=dims)
        if origin is not None:
            note(args, origin.message)
    return 0


def _with_hvp(model, spec, feeds, dy, dims, args) -> int:
    """`grad --hvp`: the gradients and H·v from one forward-over-reverse pass."""
    from ..errors import FeedError
    from .jvp_cmd import directions_of

    if dy is not None:
        raise FeedError("--hvp needs a scalar y, which has no --dy: reduce y to a scalar in the graph")
    vs = directions_of(spec, args.hvp, "--hvp")
    result = model.hvp(spec.y, spec.xs, vs, spec.zs, feeds=feeds, device=args.device, dtype=args.dtype,
                       seed=args.seed, dims=dims)
    print(f"y {spec.y}: {describe(result.y)}")
    for name, g in result.grads.items():
        flag = "  [disconnected: y does not depend on it]" if name in result.disconnected else ""
        print(f"d{spec.y}/d{name}: {describe(g)}{flag}")
    for name, h in result.hvp.items():
        print(f"H·v block {name}: {describe(h)}")
    if args.out:
        save_npz(args.out, {**result.grads, **{f"hvp:{n}": h for n, h in result.hvp.items()}})
        print(f"saved {len(result.grads)} gradient(s) and H·v to {args.out}")
    return 0
