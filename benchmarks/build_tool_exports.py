"""Build the tool-written ONNX cases (`_tool_exports.CASES`), each tool in its own side venv.

    python benchmarks/build_tool_exports.py [--out DIR] [--only NAME ...] [--try [--no-build]] [--list]
    python benchmarks/build_tool_exports.py --references [--out DIR] [--only NAME ...]

A tool that cannot be installed, or a case that fails to build, is skipped with one line saying
why. --try then runs each built case through onnxgrad in this interpreter: the forward pass
against onnxruntime on the case's feeds, one float64 gradient, and `onnxgrad check --mode fast`.
--references builds nothing: for each case already built it writes the torch-autograd oracle
(reference.npz, by `_tool_references.py` in the tool's venv) and compares onnxgrad's float64
gradient with it (`_tool_references_check`).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _tool_exports import CASES, DEFAULT_OUT, TOOLS, VENVS, _env, _last_line, build_all, load_case  # noqa: E402

REFERENCES = Path(__file__).with_name("_tool_references.py")


def size_mb(folder: Path) -> float:
    """The case's model and its external data (files named after it)."""
    model = load_case(folder)["model"]
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith(model)) / 2**20


def try_case(folder: Path) -> dict:
    """What onnxgrad makes of one built case; each stage records its error line instead of raising."""
    import onnxruntime as ort

    import engine

    case = load_case(folder)
    feeds, row, model = case["feeds"], {"MB": f"{size_mb(folder):.2f}"}, None
    try:
        t = time.perf_counter()
        model = engine.load(case["path"])
        row["load_s"] = f"{time.perf_counter() - t:.2f}"
        sess = ort.InferenceSession(case["path"], providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        t = time.perf_counter()
        got = model.run(feeds)
        row["run_s"] = f"{time.perf_counter() - t:.2f}"
        shapes = [k for k, v in want.items() if got[k].shape != v.shape]
        if shapes:
            row["shape_mismatch"] = ", ".join(f"{k}: {got[k].shape} vs {want[k].shape}" for k in shapes)
        # The merged decoders' with-past branch returns empty encoder "presents": nothing to compare there.
        row["max_diff"] = f"{max(float(np.abs(got[k] - v).max()) for k, v in want.items() if v.size):.2g}"
        row["y_diff"] = f"{float(np.abs(got[case['y']] - want[case['y']]).max()):.2g}"
    except Exception as e:  # noqa: BLE001 - a report, not a test: keep going with the other stages
        row["forward"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    try:
        if model is None:
            raise RuntimeError("not loaded")
        t = time.perf_counter()
        res = model.gradient(case["y"], case["xs"], case["zs"], feeds, dtype="float64")
        row["grad_s"] = f"{time.perf_counter() - t:.2f}"
        finite = all(np.isfinite(g).all() for g in res.grads.values())
        row["grad"] = "ok" if finite else "non-finite"
        row["grad_norms"] = ", ".join(f"{k}: {np.linalg.norm(g):.3g}" for k, g in res.grads.items())
    except Exception as e:  # noqa: BLE001
        row["grad"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    cmd = ["onnxgrad", "check", case["path"], "--y", case["y"], "--xs", ",".join(case["xs"]),
           "--zs", ",".join(case["zs"]), "--feeds", str(folder / "feeds.npz"), "--mode", "fast"]
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        out = (done.stdout + done.stderr).strip().splitlines()
        row["check"] = f"exit {done.returncode}: " + " | ".join(
            ln.strip() for ln in out if ln.lstrip().startswith(("PASS", "FAIL", "INCONCL", "verdict", "onnxgrad:",
                                                                  "note", "ERROR")))
    except subprocess.TimeoutExpired:
        row["check"] = "timed out after 900 s"
    row["check_s"] = f"{time.perf_counter() - t:.1f}"
    return row


def write_reference(name: str, folder: Path) -> str:
    """Run `_tool_references.py` for a built case in its tool's venv (it adds only reference.npz);
    one line: its forward check, or why it was skipped."""
    tool = CASES[name].tool
    python = VENVS / tool / "bin" / "python"
    if not (VENVS / tool / ".onnxgrad-installed").exists() or not python.exists():
        return f"skip {name}: no {tool} venv in {VENVS} (build the case first)"
    done = subprocess.run([str(python), str(REFERENCES), name, str(folder)], capture_output=True, text=True,
                          env=_env(TOOLS[tool], VENVS / tool), cwd=str(folder))
    out = done.stdout + done.stderr
    if done.returncode:
        return f"skip {name}: no reference: {_last_line(out)}"
    return " | ".join(ln for ln in out.splitlines() if ln.startswith(f"{name}: float"))


def references(built: dict[str, Path]) -> None:
    from _tool_references_check import TARGET, reference_errors

    for name, folder in built.items():
        line = write_reference(name, folder)
        print(line, flush=True)
        if not line.startswith("skip"):
            r = reference_errors(folder)
            print(f"  onnxgrad float64 gradient vs torch autograd: worst relative L2 {r['worst']:.2g} "
                  f"({r['worst_x']}), {'within' if r['passed'] else 'ABOVE'} {TARGET:g}; y {r['y']:.2g}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--only", nargs="+", choices=sorted(CASES), metavar="NAME", help="build only these cases")
    ap.add_argument("--try", dest="try_", action="store_true", help="then run each built case through onnxgrad")
    ap.add_argument("--no-build", action="store_true", help="with --try: try the cases already built in --out")
    ap.add_argument("--references", action="store_true",
                    help="build nothing: write each built case's torch-autograd reference and compare onnxgrad to it")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    if args.list:
        for c in CASES.values():
            print(f"{c.name:20s} {c.tool:12s} {c.what}")
        return 0
    if args.no_build or args.references:
        built = {n: Path(args.out) / n for n in args.only or CASES if (Path(args.out) / n / "case.json").exists()}
    else:
        results = build_all(args.out, args.only, log=lambda msg: print(msg, flush=True))
        built = {n: r for n, r in results.items() if isinstance(r, Path)}
    if args.references:
        references(built)
        return 0
    for name, folder in built.items() if args.try_ else ():
        print(f"\n== {name}", flush=True)
        for k, v in try_case(folder).items():
            print(f"  {k}: {v}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
