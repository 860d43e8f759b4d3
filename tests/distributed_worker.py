"""One rank of the data-parallel tests (tests/gradmanager/test_distributed.py starts it; not a test itself).

    python tests/distributed_worker.py MODE OUT_DIR STORE_FILE      (RANK and WORLD_SIZE in the environment)

ONNXGRAD_TEST_DEVICE=cuda trains on the GPU LOCAL_RANK names, over NCCL (gloo otherwise).

Every rank fine-tunes sample_models/mlp.onnx in float64 on its shard (4 rows) of each 8-row
batch, with the all-reduce between a callback that records the local gradient and one that
records the reduced one. MODE: "train" (50 steps, then one backward with a SUM all-reduce),
"die" (rank 1 kills itself at step 10), "attach" (rank 1 leaves b2 out of the all-reduce).
An engine error is printed as one line and the exit code is 2.
"""
from __future__ import annotations

import os
import signal
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import engine  # noqa: E402
from engine import distributed  # noqa: E402

PARAMS = ["W1", "b1", "W2", "b2"]
STEPS, LR, ROWS = 50, 0.1, 4


def batches(steps: int = STEPS) -> list[tuple[np.ndarray, np.ndarray]]:
    """The full 8-row batches, the same on every rank (and in the test's single-process reference)."""
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((8, 3))
    out = []
    for _ in range(steps):
        X = rng.standard_normal((2 * ROWS, 8))
        out.append((X, np.eye(3)[(X @ teacher).argmax(1)]))
    return out


def sgd_step(gm) -> None:
    """torch.optim.SGD's update, written out: building an optimizer imports torch._dynamo (seconds)."""
    with torch.no_grad():
        for n in PARAMS:
            gm.params[n].add_(gm.grad[n], alpha=-LR)
    gm.zero_grad()


def main(mode: str, out_dir: str, store: str) -> None:
    device = distributed.init(os.environ.get("ONNXGRAD_TEST_DEVICE", "cpu"),
                              timeout=float(os.environ.get("ONNXGRAD_TEST_TIMEOUT", 20)), init_method=f"file://{store}")
    rank = distributed.rank()
    gm = engine.GradManager(os.path.join(ROOT, "sample_models", "mlp.onnx"), device=device, dtype="float64")
    distributed.broadcast_params(gm)
    local, reduced = {}, {}

    def keep_local(name, g):
        local[name] = g.clone()
        return g

    def keep_reduced(name, g):
        reduced[name] = g.clone()
        return g

    allreduce = distributed.make_allreduce_cb("MEAN", bucket_mb=100 / 2 ** 20)  # ~100 bytes: several buckets
    names = PARAMS[:3] if mode == "attach" and rank == 1 else PARAMS
    gm.attach(names, callbacks=[keep_local, allreduce, keep_reduced])
    first = {}
    for step, (X, T) in enumerate(batches()):
        if mode == "die" and rank == 1 and step == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        rows = slice(rank * ROWS, (rank + 1) * ROWS)
        with gm:
            gm.run({"X": X[rows], "T": T[rows]})
            gm.backward("loss")
        if step == 0:
            first = {f"local_{n}": local[n].cpu().numpy() for n in PARAMS}
            first |= {f"reduced_{n}": reduced[n].cpu().numpy() for n in PARAMS}
            stats = allreduce.last_backward
        sgd_step(gm)
    gm.save(os.path.join(out_dir, f"rank{rank}.onnx"), all_ranks=True)
    gm.save(os.path.join(out_dir, "rank0_only.onnx"))

    # One more backward through a SUM all-reduce on a second manager, at the trained weights.
    summed = engine.GradManager(gm.model, params=gm.params).attach(PARAMS, [keep_local, distributed.make_allreduce_cb("SUM")])
    with summed:
        summed.run({"X": batches()[0][0][rows], "T": batches()[0][1][rows]})
        summed.backward("loss")
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
             **{f"param_{n}": gm.params[n].detach().cpu().numpy() for n in PARAMS}, **first,
             **{f"sum_{n}": gm.grad[n].cpu().numpy() for n in PARAMS},
             **{f"sumlocal_{n}": local[n].cpu().numpy() for n in PARAMS},
             buckets=stats.buckets, sent_during_backward=stats.sent_during_backward)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except engine.OnnxGradError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
