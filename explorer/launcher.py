"""The `onnxgrad` console script: the explorer, or the engine's CLI for any subcommand.

    onnxgrad                 the explorer on the bundled spec example (Conv -> Gemm)
    onnxgrad MODEL.onnx      the explorer on MODEL (as `netron MODEL` does); same as `onnxgrad explore MODEL`
    onnxgrad COMMAND ...     the engine's CLI (`engine.cli.main`), with `explore` added to its commands

Nothing here imports torch, Textual or the engine's numeric modules until a command runs, so
`--help` and argument errors answer at Python start-up speed.
"""
from __future__ import annotations

import os
import sys

from engine.cli.common import add_dim_argument, add_ops_argument, load_ops

EPILOG = ("onnxgrad MODEL.onnx is short for onnxgrad explore MODEL.onnx; "
          "onnxgrad alone opens the explorer on the bundled example (the Gradient spec's Conv -> Gemm model).")


def add_explore_parser(sub) -> None:
    p = sub.add_parser("explore", help="open the explorer, a terminal app, on MODEL (also: onnxgrad MODEL)")
    p.add_argument("model", metavar="MODEL", help="path to an .onnx file, or a folder holding one")
    p.add_argument("--seed", type=int, default=0, help="seed for random values of unfed tensors (default 0)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="compute dtype in the app (default float32)")
    add_ops_argument(p)
    add_dim_argument(p)
    p.set_defaults(handler=explore)


def explore(args) -> int:
    load_ops(args)  # before the model, and registered while the app runs; a bad file: one line, exit 2
    model = label = None
    dims = {}
    if args.model is not None:
        import engine
        from engine.cli.common import parse_dim_arguments

        model = engine.load(args.model)  # a bad file: one line and exit 2 from engine.cli.main
        label = os.path.basename(model.graph.path or args.model)  # a folder opens its one .onnx file
        dims = parse_dim_arguments(model, args)  # a bad --dim too
    from .app import make_app

    app = make_app(model=model, label=label, seed=args.seed, dtype=args.dtype, dims=dims)
    app.run()
    return 0 if app.return_code in (None, 0) else int(app.return_code)


def _is_model_path(arg: str, commands) -> bool:
    return arg not in commands and not arg.startswith("-") and (arg.lower().endswith(".onnx") or os.path.isfile(arg)
                                                                or os.path.isdir(arg))


def main(argv: list[str] | None = None) -> int:
    from engine.cli import COMMANDS, build_parser
    from engine.cli import main as cli_main

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        from types import SimpleNamespace

        return explore(SimpleNamespace(model=None, seed=0, dtype="float32", dim=[]))
    if _is_model_path(argv[0], COMMANDS):
        argv = ["explore", *argv]
    if argv[0] != "explore":
        _openmp_as_the_user_set_it()
    if argv in (["-h"], ["--help"]):
        parser = build_parser([add_explore_parser])
        parser.epilog = EPILOG
        parser.print_help()
        return 0
    return cli_main(argv, extra=[add_explore_parser])


def _openmp_as_the_user_set_it() -> None:
    """Torch is not loaded yet: the CLI's compute-bound runs keep OpenMP's default thread policy."""
    from . import SET_OMP_WAIT_POLICY

    if SET_OMP_WAIT_POLICY:
        os.environ.pop("OMP_WAIT_POLICY", None)
