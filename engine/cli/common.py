"""Argument helpers shared by subcommands: model loading, feeds, output files.

Only the standard library at import time: building the parser (and so `--help` and argument
errors) must not pay for numpy, onnx or torch. Each helper imports what it needs when it runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import TYPE_CHECKING

from ..errors import FeedError
from ..gradient.feed_syntax import SPEC_HELP

if TYPE_CHECKING:
    import numpy as np

    from ..model import Model


OPS_HELP = "a Python file that registers ops (forward + VJP) when imported; repeatable (docs/cli.md)"


def add_model_argument(p: argparse.ArgumentParser, ops: bool = True) -> None:
    p.add_argument("model", metavar="MODEL", help="path to an .onnx file, or a folder holding one")
    if ops:  # commands that run the model can run ops registered by a file
        add_ops_argument(p)


def add_ops_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", action="append", default=[], metavar="FILE.py", help=OPS_HELP)


def load_ops(args) -> None:
    from ..opsfile import load_ops_file

    for path in getattr(args, "ops", None) or []:
        load_ops_file(path)


def add_feed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--feed", action="append", default=[], metavar="NAME=SPEC",
                   help=f"value for a tensor (inputs or intermediates); SPEC is {SPEC_HELP}")
    p.add_argument("--feeds", metavar="FILE.npz", help="values for tensors, keyed by tensor name")
    add_dim_argument(p)


def add_dim_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N[,NAME=N]",
                   help="size of a symbolic dim (seq=32,batch=2) for every value made up for an unfed input "
                        "(default: what a feed shows, else 1); repeatable")
    p.add_argument("--past", type=int, default=None, metavar="N",
                   help="for an LLM with past key values: the positions already cached, for every value made up "
                        "(default: what a feed shows, else 4, before 2 current positions)")


def parse_dim_arguments(model: Model, args) -> dict[str, int]:
    """--dim seq=32 --dim batch=2 (or seq=32,batch=2), checked against the model's symbolic dims,
    and --past N as the size of every past-length dim."""
    from ..gradient.dims import check_dims, parse_dims
    from ..gradient.past_feeds import with_past

    dims: dict[str, int] = {}
    for text in getattr(args, "dim", None) or []:
        dims.update(parse_dims(text))
    return with_past(model.graph, check_dims(model.graph, dims), getattr(args, "past", None))


def add_selection_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--y", required=required, help="the tensor to differentiate" + ("" if required else
                                                   " (with --xs: highlights the slice)"))
    p.add_argument("--xs", required=required, default="", help="comma-separated tensors to differentiate with respect to")
    p.add_argument("--zs", default="", help="comma-separated tensors held fixed; 'inputs' stands for every graph "
                                            "input not in xs")


def selection_of(model: Model, args):
    """The validated (y, xs, zs) of --y/--xs/--zs (`inputs` in --zs stands for every graph input not
    in xs: engine.gradient.selection.validate); the extension's notes for the user."""
    spec = model.selection(args.y, args.xs, args.zs)
    for d in spec.determined:
        note(args, d.note)
    return spec


def add_device_arguments(p: argparse.ArgumentParser, dtype: bool = True) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    if dtype:
        p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                       help="compute every float tensor in this dtype (default: the model's own)")


def open_model(args) -> Model:
    from .. import load

    load_ops(args)
    return load(args.model, compile=getattr(args, "compile", False))


def add_compile_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action="store_true",
                   help="run the compiled plan under torch.compile (slow first call; falls back with a warning)")


def collect_feeds(model: Model, args, seed: int = 0, *, targets=(), members=()) -> dict[str, np.ndarray]:
    """--feeds and --feed values, plus the engine's default for every unfed member of xs ∪ zs and
    every unfed graph input computing `targets` reads (one note per default on stderr). Symbolic
    dims come from --dim, else from the files fed (so `--feed mask=ones` matches ids.npy)."""
    from ..gradient.dims import describe_dims, dims_from_feeds
    from ..gradient.feed_checks import check_feed
    from ..gradient.feeds import complete_feeds, is_file_spec, load_npz, parse_assignment, parse_spec

    dims = parse_dim_arguments(model, args)
    feeds: dict[str, np.ndarray] = {}
    if getattr(args, "feeds", None):
        feeds.update(load_npz(args.feeds))
    assignments = [parse_assignment(text) for text in getattr(args, "feed", []) or []]
    model.check_feed_names({name: None for name, _ in assignments})
    for name, spec in sorted(assignments, key=lambda a: not is_file_spec(a[1])):  # files first: they size dims
        feeds[name] = parse_spec(model.graph, name, spec, default_seed=seed, dims=dims_from_feeds(model.graph, feeds, dims))
    for name, value in feeds.items():
        if model.graph.has_tensor(name):
            check_feed(model.graph, name, value, dims)
    if not (targets or members):
        return feeds
    from ..dtypes import parse_device

    parse_device(getattr(args, "device", "cpu"))  # a bad device is the one error, before any note
    feeds, chosen = complete_feeds(model, feeds, targets=targets, members=members, seed=seed, dims=dims)
    for d in chosen:
        note(args, d.note)
    made_up = [d.name for d in chosen if d.name in model.graph.inputs]
    if sized := describe_dims(model.graph, made_up, dims_from_feeds(model.graph, feeds, dims)):
        from ..gradient.past_feeds import past_layout

        past = ", --past N the past length" if past_layout(model.graph) is not None else ""
        note(args, f"symbolic dims of the made-up values: {sized} (--dim NAME=N sets one{past}; unset dims are 1)")
    if made_up:
        from ..gradient.made_up import blame_made_up

        args.blame_made_up = lambda exc: blame_made_up(model.graph, made_up, exc)
    return feeds


def note(args, text: str) -> None:
    """A line for stderr: after the command's output when run by `engine.cli.main`, else now."""
    notes = getattr(args, "notes", None)
    if isinstance(notes, list):
        notes.append(text)
    else:
        err(f"note: {text}")


def parse_dy(model: Model, y: str, spec: str | None, seed: int) -> np.ndarray | None:
    if spec is None:
        return None
    from ..gradient.feeds import declared_dtype, parse_spec

    info = model.graph.types.get(y)
    shape = "unknown shape" if info is None or info.shape is None else f"shape {list(info.shape)}"
    label = f"--dy (the seed for y {y!r}: {shape}, {declared_dtype(model.graph, y)})"
    return parse_spec(model.graph, y, spec, default_seed=seed, label=label)


def write_json(dest: str, text: str) -> None:
    """`--json DEST`: the text on stdout for '-', else into the file."""
    if dest == "-":
        print(text)
    else:
        with open(dest, "w") as fh:
            fh.write(text + "\n")


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FeedError(f"cannot write {path}: folder {folder} does not exist")
    import numpy as np

    with open(path, "wb") as fh:  # np.savez would append .npz to a name without it
        np.savez(fh, **arrays)


def describe(arr: np.ndarray) -> str:
    import numpy as np

    arr = np.asarray(arr)
    if arr.size == 0:
        return f"shape {arr.shape} {arr.dtype} (empty)"
    if arr.dtype.kind in "fc":
        finite = np.isfinite(arr)
        extra = "" if finite.all() else f", {int((~finite).sum())} non-finite"
        a = arr[finite] if finite.any() else np.zeros(1)
        return (f"shape {arr.shape} {arr.dtype}  norm {np.linalg.norm(a.astype(np.float64)):.6g}  "
                f"min {a.min():.6g}  max {a.max():.6g}{extra}")
    return f"shape {arr.shape} {arr.dtype}  min {arr.min()}  max {arr.max()}"


def err(msg: str) -> None:
    print(msg, file=sys.stderr)


class Stages:
    """`with Stages() as stage: stage("loading model.onnx") ...`: a spinner on stderr naming the stage
    under way, shown once the command has run for `after` seconds (quick commands print nothing)
    and only when stderr is a terminal. It goes away when the block ends."""

    def __init__(self, after: float = 1.0):
        self.after = after
        self.text = ""
        self._status = None
        self._timer = None
        self._lock = threading.Lock()

    def __enter__(self):
        if sys.stderr.isatty():
            self._timer = threading.Timer(self.after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __call__(self, text: str) -> None:
        with self._lock:
            self.text = text
            if self._status is not None:
                self._status.update(text + "…")

    def _show(self) -> None:
        from rich.console import Console

        with self._lock:
            if self._timer is None:
                return
            self._status = Console(stderr=True).status(self.text + "…", spinner="dots")
            self._status.start()

    def __exit__(self, *exc):
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._status is not None:
                self._status.stop()
                self._status = None
        return False
