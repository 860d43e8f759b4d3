"""onnxgrad conformance --mutants [MODEL]: wrong VJPs injected into the model's ops; how many each check mode kills.

Without MODEL, the sample models (sample_models/, with the selections their catalogue teaches).
Exit 1 when a mutant survives full or fast mode, or a check of the unmutated model fails.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import OnnxGradError

SAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sample_models")
# kinks sits exactly on its kinks (nothing can be decided); spec_second_order differentiates a
# Gradient node, whose inner VJPs a mutant's hand-made backward cannot differentiate again.
SKIPPED_SAMPLES = ("kinks", "spec_second_order")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mutants", nargs="?", const="", default=None, metavar="MODEL",
                   help="inject wrong VJPs (sign, scale, dropped factor, permuted axes, broadcast, zeroed part, "
                        "swapped inputs) into MODEL's ops, or the sample models', and count what each check mode kills")
    p.add_argument("--y", help="with --mutants MODEL: the tensor to differentiate (default: the first output)")
    p.add_argument("--xs", default="", help="with --mutants MODEL: comma-separated xs (default: the float inputs)")
    p.add_argument("--zs", default="", help="with --mutants MODEL: comma-separated zs ('inputs': every graph input)")
    p.add_argument("--feed", action="append", default=[], metavar="NAME=SPEC", help="with --mutants MODEL: a value")
    p.add_argument("--feeds", metavar="FILE.npz", help="with --mutants MODEL: values keyed by tensor name")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N[,NAME=N]", help="symbolic dims")
    p.add_argument("--modes", default="auto,full,fast,sample",
                   help="with --mutants: the check modes to run (default auto,full,fast,sample)")


def run_mutants_command(args) -> int:
    from ..conformance.mutation import MODES, run_mutants

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise OnnxGradError(f"--modes takes {', '.join(MODES)}, not {args.modes!r}")
    jobs = [_model_job(args)] if args.mutants else _sample_jobs(args)
    reports = []
    for name, load, y, xs, zs, feeds in jobs:
        report = run_mutants(load, y, xs, zs, feeds, modes=modes, seed=args.seed, progress=_progress(name))
        print(report.summary())
        reports.append(report)
    if args.json:
        import json

        from .common import write_json

        write_json(args.json, json.dumps([_plain(r) for r in reports], indent=1))
    survived = any(r.survivors(m) for r in reports for m in modes if m in ("full", "fast"))
    false_alarm = any(v == "fail" for r in reports for v in r.right.values())
    return 1 if survived or false_alarm else 0


def _model_job(args):
    from .. import load
    from .common import collect_feeds, selection_of

    model = load(args.mutants)
    graph = model.graph
    y = args.y or next(iter(model.outputs), None)
    if y is None:
        raise OnnxGradError(f"{args.mutants} has no outputs: give --y")
    xs = [x for x in args.xs.split(",") if x] or [n for n in model.inputs if graph.types[n].is_float]
    if not xs:
        raise OnnxGradError(f"{args.mutants} has no float inputs: give --xs")
    spec = selection_of(model, argparse.Namespace(y=y, xs=",".join(xs), zs=args.zs, notes=args.notes))
    feeds = collect_feeds(model, args, seed=args.seed, members=spec.inputs)
    return model.name, (lambda: load(args.mutants)), spec.y, list(spec.xs), list(spec.zs), feeds


def _sample_jobs(args):
    from .. import load
    from .common import collect_feeds

    catalogue = _catalogue()
    jobs = []
    for sample in catalogue.SAMPLES:
        path = os.path.join(SAMPLES_DIR, sample.filename)
        if sample.name in SKIPPED_SAMPLES or not os.path.exists(path):
            continue
        model = load(path)
        feed_args = argparse.Namespace(feed=[f"{k}={v}" for k, v in sample.feeds.items()], feeds=None, dim=[],
                                       notes=[])
        feeds = collect_feeds(model, feed_args, seed=args.seed, members=model.selection(
            sample.y, sample.xs, sample.zs).inputs)
        jobs.append((sample.name, (lambda p=path: load(p)), sample.y, list(sample.xs), list(sample.zs), feeds))
    return jobs


def _catalogue():
    path = os.path.join(SAMPLES_DIR, "build.py")
    if not os.path.exists(path):
        raise OnnxGradError("no sample_models/ beside the engine (an installed copy): give a MODEL to --mutants")
    import importlib.util  # here, not at the top: `onnxgrad --help` reads this module

    spec = importlib.util.spec_from_file_location("onnxgrad_sample_catalogue", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def _progress(name: str):
    if not sys.stderr.isatty():
        return None

    def show(k: int, n: int, label: str) -> None:
        sys.stderr.write(f"\r{name}: mutant {k + 1}/{n} {label[:50]:<50}")
        sys.stderr.flush()

    return show


def _plain(report) -> dict:
    return {"model": report.model, "y": report.y, "xs": list(report.xs), "unmutated": report.right,
            "tally": {m: report.tally(m) for m in report.modes},
            "mutants": [{"mutant": o.mutant.label, "moved": o.moved if o.moved == o.moved else "nan",
                         "counted": o.counted, "outcomes": o.outcomes,
                         "seconds": o.seconds, "error": o.error} for o in report.outcomes]}
