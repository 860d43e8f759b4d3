"""Start-up of the `onnxgrad` console script, timed per process against Python itself.

    python benchmarks/bench_cli.py [--runs 15]

Each sample is a whole process, wall clock (what a user waits for). The commands take turns run
by run with their peers so that a loaded machine slows every side alike:
- `onnxgrad --help`, `onnxgrad ops`, and a bad-file error against `python -c pass` (the floor);
- `onnxgrad run` on a sample model against `python -c "import torch"` (target: at most 1.5x).
The console script is run as `python -c "from explorer.launcher import main; ..."`, from this
tree (checked). Results go to benchmarks/results/cli.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _results import write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "import sys; from explorer.launcher import main; sys.exit(main())"


def onnxgrad(*argv: str) -> list[str]:
    return [sys.executable, "-c", SCRIPT, *argv]


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "cli.json"))
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    where = subprocess.run([sys.executable, "-c", "import engine; print(engine.__file__)"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(ROOT), f"timing {where}, not this tree"
    empty = os.path.join(tempfile.mkdtemp(), "empty.onnx")
    open(empty, "wb").close()
    mlp = os.path.join(ROOT, "sample_models", "mlp.onnx")
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "onnxgrad --help": onnxgrad("--help"),
        "onnxgrad ops": onnxgrad("ops"),
        "onnxgrad run empty.onnx (error)": onnxgrad("run", empty),
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "onnxgrad run mlp.onnx": onnxgrad("run", mlp, "--feed", "X=ones", "--feed", "T=zeros"),
    }
    for cmd in commands.values():  # warm the file cache
        timed(cmd, env)
    samples = {k: [] for k in commands}
    for _ in range(args.runs):
        for k, cmd in commands.items():
            samples[k].append(timed(cmd, env))
    med = {k: statistics.median(v) for k, v in samples.items()}
    floor, torch_import = med["python -c pass"], med['python -c "import torch"']
    rows = []
    for k, v in med.items():
        peer = torch_import if k == "onnxgrad run mlp.onnx" else floor
        rows.append({"command": k, "median_s": v, "min_s": min(samples[k]), "max_s": max(samples[k]),
                     "over_peer": v / peer,
                     "peer": 'python -c "import torch"' if k == "onnxgrad run mlp.onnx" else "python -c pass"})
        print(f"{k:36} median {v:7.3f}s  (min {min(samples[k]):.3f}, max {max(samples[k]):.3f})"
              f"  {v / peer:5.2f}x {rows[-1]['peer']}")
    write_json(args.out, {"runs": args.runs, "timing": "wall seconds per process, medians, commands interleaved",
                          "load_average": os.getloadavg(), "rows": rows})
    print(f"wrote {os.path.relpath(args.out, ROOT)}  (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
