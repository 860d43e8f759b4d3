"""onnxgrad jvp MODEL --y Y --xs A,B [--tangent random|ones|FILE.npz]: J·v by forward mode."""
from __future__ import annotations

from .common import (
    add_device_arguments,
    add_feed_arguments,
    add_model_argument,
    add_selection_arguments,
    collect_feeds,
    describe,
    open_model,
    parse_dim_arguments,
    save_npz,
    selection_of,
)

DIRECTION_HELP = "random (seeded by --seed), ones, or FILE.npz keyed by x name (one array alone serves one x)"


def add_parser(sub) -> None:
    p = sub.add_parser("jvp", help="J·v: y's derivative along a tangent of xs, by forward mode (one pass)")
    add_model_argument(p)
    add_selection_arguments(p)
    add_feed_arguments(p)
    p.add_argument("--tangent", default="random", metavar="SPEC", help=f"the tangent v: {DIRECTION_HELP}")
    p.add_argument("--seed", type=int, default=0, help="seed for the random tangent and unfed values (default 0)")
    add_device_arguments(p)
    p.add_argument("--out", metavar="FILE.npz", help="save J·v (keyed by y's name) and the tangents (by x name)")
    p.set_defaults(handler=run)


def directions_of(spec, text: str, flag: str):
    """--tangent / --hvp: a word for every x, or arrays from an .npz keyed by x name."""
    if text in ("random", "ones"):
        return text
    from ..errors import FeedError
    from ..gradient.feeds import load_npz

    if not text.endswith(".npz"):
        raise FeedError(f"{flag} {text!r}: give random, ones or a FILE.npz keyed by x name")
    arrays = load_npz(text)
    if len(spec.xs) == 1 and len(arrays) == 1 and spec.xs[0] not in arrays:
        return {spec.xs[0]: next(iter(arrays.values()))}
    return arrays


def run(args) -> int:
    model = open_model(args)
    spec = selection_of(model, args)
    feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
    tangents = directions_of(spec, args.tangent, "--tangent")
    result = model.jvp(spec.y, spec.xs, tangents, spec.zs, feeds=feeds, device=args.device, dtype=args.dtype,
                       seed=args.seed, dims=parse_dim_arguments(model, args))
    where = args.tangent if args.tangent in ("random", "ones") else "from " + args.tangent
    print(f"y {spec.y}: {describe(result.y)}")
    for name, v in result.tangents.items():
        flag = "  [disconnected: y does not depend on it]" if name in result.disconnected else ""
        print(f"tangent {name} ({where}): {describe(v)}{flag}")
    print(f"J·v of {spec.y}: {describe(result.jvp)}")
    if args.out:
        save_npz(args.out, {spec.y: result.jvp, **{f"tangent:{n}": v for n, v in result.tangents.items()}})
        print(f"saved J·v and {len(result.tangents)} tangent(s) to {args.out}")
    return 0
