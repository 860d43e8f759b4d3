"""`onnxgrad` command line. Each subcommand is a module with `add_parser(subparsers)` and `run(args) -> int`.

Exit codes: 0 success, 1 a check failed, 3 a check was inconclusive only, 2 bad input or usage.
Bad input is reported as one line on stderr; `--debug` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from ..errors import OnnxGradError

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ["run", "grad", "jvp", "ops", "graph", "check", "diff", "conformance", "lower"]


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we keep it to one line
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


AddParser = Callable[[argparse._SubParsersAction], None]


def build_parser(extra: Sequence[AddParser] = ()) -> argparse.ArgumentParser:
    """The parser; `extra` adds commands that live outside the engine (the launcher's `explore`), listed first."""
    parser = OneLineParser(prog="onnxgrad", description="Run, differentiate and verify ONNX models on PyTorch.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for add_parser in extra:
        add_parser(sub)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}_cmd").add_parser(sub)
    return parser


def main(argv: list[str] | None = None, extra: Sequence[AddParser] = ()) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(extra)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: argparse has already printed
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    from ..opsfile import registrations_undone

    if args.command == "check":
        from ..run.allocator import hold_mmap_threshold

        # check's freed float64 values leave its resident memory (engine/run/allocator.py). Not for the
        # other commands: a held threshold makes every block over 128 KiB a system call, and a float64
        # finite-difference test of a 4-bit BERT took 3x as long with it (12.7 s -> 36.9 s, sys 0.8 -> 24.7 s).
        hold_mmap_threshold()

    args.notes = []  # defaults the command chose; printed after it, so a failure stays one line
    try:
        with registrations_undone():  # --ops files register for this command only
            code = int(args.handler(args) or 0)
        for note in args.notes:
            print(f"note: {note}", file=sys.stderr)
        return code
    except (OnnxGradError, OSError) as exc:
        if args.debug:
            raise
        blame = getattr(args, "blame_made_up", None)
        if blame is not None and str(exc).startswith("node "):  # a step failed: made-up values may be why
            for note in args.notes:
                print(f"note: {note}", file=sys.stderr)
            exc = blame(exc)
        print(f"onnxgrad: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("onnxgrad: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug of ours; still one line unless --debug
        if args.debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"onnxgrad: internal error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 2
