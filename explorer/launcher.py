"""The `onnxgrad` console script: the explorer, or the engine's CLI for any subcommand.

    onnxgrad                 the explorer on the bundled spec example (Conv -> Gemm)
    onnxgrad explore MODEL   the explorer on MODEL (exit 2 with one line if it cannot be loaded)
    onnxgrad ...             anything else goes to `engine.cli.main`
"""
from __future__ import annotations

import os
import sys

USAGE = "usage: onnxgrad explore MODEL [--seed N] [--dtype float32|float64]"


EXPLORER_HELP = """
the explorer (a terminal app):
  onnxgrad                  open the bundled example (the Gradient spec's Conv -> Gemm model)
  onnxgrad explore MODEL    open MODEL  [--seed N] [--dtype float32|float64]"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in (["-h"], ["--help"]):
        from engine.cli import build_parser

        build_parser().print_help()
        print(EXPLORER_HELP)
        return 0
    if argv and argv[0] != "explore":
        from engine.cli import main as cli_main

        return cli_main(argv)
    from engine.errors import OnnxGradError

    args = argv[1:]
    options = {"seed": "0", "dtype": "float32"}
    paths = []
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(USAGE)
            return 0
        if a.startswith("--") and a[2:] in options:
            if not args:
                print(f"onnxgrad explore: error: {a} needs a value ({USAGE})", file=sys.stderr)
                return 2
            options[a[2:]] = args.pop(0)
        elif a.startswith("-"):
            print(f"onnxgrad explore: error: unknown option {a} ({USAGE})", file=sys.stderr)
            return 2
        else:
            paths.append(a)
    if argv and len(paths) != 1:
        print(f"onnxgrad explore: error: give exactly one MODEL ({USAGE})", file=sys.stderr)
        return 2
    if options["dtype"] not in ("float32", "float64") or not options["seed"].lstrip("-").isdigit():
        print(f"onnxgrad explore: error: bad --seed or --dtype ({USAGE})", file=sys.stderr)
        return 2
    import engine

    from .app import make_app

    model = label = None
    if paths:
        try:
            model = engine.load(paths[0])
        except OnnxGradError as exc:
            print(f"onnxgrad: error: {exc}", file=sys.stderr)
            return 2
        label = os.path.basename(paths[0])
    app = make_app(model=model, label=label, seed=int(options["seed"]), dtype=options["dtype"])
    app.run()
    return 0 if app.return_code in (None, 0) else int(app.return_code)
