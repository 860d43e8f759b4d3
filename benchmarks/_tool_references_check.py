"""onnxgrad's float64 gradient of a built tool case against its torch-autograd oracle
(reference.npz, written by `_tool_references.py` in the tool's venv).

    python benchmarks/_tool_references_check.py [FOLDER ...]   (default: every case with a reference)

Issue 33's target: relative L2 error ≤ TARGET for every x.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _tool_exports import DEFAULT_OUT, load_case  # noqa: E402

TARGET = 1e-6


class StaleReference(Exception):
    """reference.npz does not belong to the case's current model, feeds or selection."""


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    """|got - want| / |want| in the L2 norm; the absolute norm where the reference is all zeros."""
    diff = float(np.linalg.norm(np.asarray(got, np.float64) - want))
    scale = float(np.linalg.norm(want))
    return diff / scale if scale else diff


def reference_errors(folder) -> dict:
    """{"grads": {x: relative L2 error}, "worst": max of them, "worst_x", "y": relative L2 error of
    onnxgrad's float64 y, "grad_s": seconds of the gradient call (load excluded, compile included),
    "passed": worst ≤ TARGET}.
    Raises FileNotFoundError when the case has no reference.npz, StaleReference when it was written
    for another build of the case."""
    from _tool_references import fingerprint

    import engine

    folder = Path(folder)
    case = load_case(folder)
    with np.load(folder / "reference.npz") as npz:
        ref = {k: npz[k] for k in npz.files}
    if str(ref["fingerprint"]) != fingerprint(folder):
        raise StaleReference(f"{folder / 'reference.npz'} was written for another build of the case: "
                             "rerun build_tool_exports.py --references")
    model = engine.load(case["path"])
    t = time.perf_counter()
    res = model.gradient(case["y"], case["xs"], case["zs"], case["feeds"], dy=ref["dy"], dtype="float64")
    grad_s = time.perf_counter() - t
    # A disconnected x's gradient is zero, whether or not the result lists it.
    errors = {x: relative_l2(res.grads.get(x, 0.0), ref[f"grad:{x}"]) for x in case["xs"]}
    worst_x = max(errors, key=errors.get)
    return {"grads": errors, "worst": errors[worst_x], "worst_x": worst_x, "y": relative_l2(res.y, ref["y"]),
            "grad_s": grad_s, "passed": errors[worst_x] <= TARGET}


def main(argv=None) -> int:
    folders = [Path(f) for f in (argv or [])] or sorted(p.parent for p in DEFAULT_OUT.glob("*/reference.npz"))
    worst = 0.0
    for folder in folders:
        r = reference_errors(folder)
        worst = max(worst, r["worst"])
        print(f"{folder.name:20s} {'PASS' if r['passed'] else 'FAIL'} worst {r['worst']:.2g} ({r['worst_x']}), "
              f"y {r['y']:.2g}, "
              f"grad {r['grad_s']:.1f} s")
        for x, e in r["grads"].items():
            print(f"    {x}: {e:.2g}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
