"""Data-parallel GradManager training (engine.distributed) with real gloo processes on loopback.

Every spawned process has a timeout and is killed if it outlives it, so a hang fails the test
instead of freezing the suite. The ranks run tests/distributed_worker.py.
"""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import engine
from engine import distributed
from tests import paths
from tests.distributed_worker import LR, PARAMS, ROWS, STEPS, batches

ROOT = paths.ROOT
WORKER = ROOT / "tests" / "distributed_worker.py"
MLP = ROOT / "sample_models" / "mlp.onnx"
LIMIT = 150  # seconds for a whole group of ranks: only a hang gets near it


def spawn(mode: str, folder: pathlib.Path, ranks=(0, 1), world: int = 2, collective_timeout: float = 20,
          env: dict | None = None) -> dict[int, subprocess.CompletedProcess]:
    """Start `ranks` of a `world`-rank group and wait for all of them (never longer than LIMIT)."""
    base = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                WORLD_SIZE=str(world), ONNXGRAD_TEST_TIMEOUT=str(collective_timeout), **(env or {}))
    store = folder / "store"
    procs = {r: subprocess.Popen([sys.executable, str(WORKER), mode, str(folder), str(store)],
                                 env=dict(base, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
             for r in ranks}
    deadline, done = time.monotonic() + LIMIT, {}
    try:
        for r, p in procs.items():
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[r] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix("error: ")


# --- two ranks train like one process ---------------------------------------------------------------
def train_two_ranks(folder: pathlib.Path, device: str = "cpu") -> dict[int, dict[str, np.ndarray]]:
    """Both ranks' float64 parameters after training, their gradients at step 0 and their SUM backward."""
    results = spawn("train", folder, env={"ONNXGRAD_TEST_DEVICE": device})
    for r, res in results.items():
        assert res.returncode == 0, f"rank {r}: {res.stderr}"
    return {r: dict(np.load(folder / f"rank{r}.npz")) for r in (0, 1)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dp")
    return folder, train_two_ranks(folder)


def single_process_training() -> dict[str, np.ndarray]:
    """The same 50 SGD steps on the full 8-row batches, in one process: the mean loss of the two
    shards (each mlp.onnx's own 4-row mean) is the full batch's mean loss."""
    gm = engine.GradManager(str(MLP), dtype="float64").attach(PARAMS)
    for X, T in batches():
        with gm:
            halves = [gm.run({"X": X[k * ROWS:(k + 1) * ROWS], "T": T[k * ROWS:(k + 1) * ROWS]})["loss"] for k in (0, 1)]
            gm.backward((halves[0] + halves[1]) / 2)
        with torch.no_grad():
            for n in PARAMS:
                gm.params[n].add_(gm.grad[n], alpha=-LR)
        gm.zero_grad()
    return {n: gm.params[n].detach().numpy() for n in PARAMS}


def torch_training() -> dict[str, np.ndarray]:
    """The MLP written directly in torch, trained on the full batches with torch's SGD."""
    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(MLP).graph.initializer}
    p = {n: torch.tensor(init[n], dtype=torch.float64, requires_grad=True) for n in PARAMS}
    for X, T in batches():
        X, T = torch.tensor(X), torch.tensor(T)
        logits = torch.relu(X @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        loss = -(T * torch.log_softmax(logits, dim=1)).sum() / len(X)
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            for t, g in zip(p.values(), grads):
                t.add_(g, alpha=-LR)
    return {n: t.detach().numpy() for n, t in p.items()}


def test_two_ranks_on_half_batches_match_one_process_on_full_batches(trained):
    folder, ranks = trained
    assert STEPS == 50
    for want in (single_process_training(), torch_training()):
        for n in PARAMS:
            for r in (0, 1):
                np.testing.assert_allclose(ranks[r][f"param_{n}"], want[n], rtol=0, atol=1e-6)
    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(MLP).graph.initializer}
    assert np.abs(ranks[0]["param_W1"] - init["W1"]).max() > 0.05  # it did train
    # The ranks saved byte-identical models; only rank 0 wrote the one saved without all_ranks.
    assert (folder / "rank0.onnx").read_bytes() == (folder / "rank1.onnx").read_bytes()
    assert (folder / "rank0_only.onnx").read_bytes() == (folder / "rank0.onnx").read_bytes()


@pytest.mark.cuda
def test_nccl_two_gpus_train_like_one_process(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL puts each rank on its own GPU: needs 2")
    ranks = train_two_ranks(tmp_path, "cuda")
    want = single_process_training()
    for n in PARAMS:
        for r in (0, 1):
            np.testing.assert_allclose(ranks[r][f"param_{n}"], want[n], rtol=0, atol=1e-6)
    assert (tmp_path / "rank0.onnx").read_bytes() == (tmp_path / "rank1.onnx").read_bytes()


def test_callbacks_before_the_allreduce_see_the_local_gradient_after_it_the_reduced_one(trained):
    _, ranks = trained
    X, T = batches()[0]
    for r in (0, 1):
        gm = engine.GradManager(str(MLP), dtype="float64").attach(PARAMS)
        with gm:
            gm.run({"X": X[r * ROWS:(r + 1) * ROWS], "T": T[r * ROWS:(r + 1) * ROWS]})
            gm.backward("loss")
        for n in PARAMS:
            np.testing.assert_allclose(ranks[r][f"local_{n}"], gm.grad[n].numpy(), rtol=1e-12, atol=1e-15)
    for n in PARAMS:
        assert np.abs(ranks[0][f"local_{n}"] - ranks[1][f"local_{n}"]).max() > 1e-3  # the shards differ
        mean = (ranks[0][f"local_{n}"] + ranks[1][f"local_{n}"]) / 2
        for r in (0, 1):
            np.testing.assert_allclose(ranks[r][f"reduced_{n}"], mean, rtol=1e-14, atol=1e-16)
            np.testing.assert_allclose(ranks[r][f"sum_{n}"], ranks[0][f"sumlocal_{n}"] + ranks[1][f"sumlocal_{n}"],
                                       rtol=1e-14, atol=1e-16)


def test_buckets_are_sent_during_the_backward(trained):
    _, ranks = trained
    # ~100-byte buckets over W1 (8x16), b1, W2 (16x3), b2, filled from the back: [b2, W2], [b1], [W1].
    assert int(ranks[0]["buckets"]) == 3
    assert int(ranks[0]["sent_during_backward"]) == 3


# --- faults -----------------------------------------------------------------------------------------
def test_a_killed_rank_gives_the_other_a_one_line_error_not_a_hang(tmp_path):
    start = time.monotonic()
    results = spawn("die", tmp_path)
    assert results[1].returncode == -signal.SIGKILL
    message = one_line_error(results[0])
    # Usually the first bucket of step 10; a reset connection can also cut the end of step 9 short.
    assert re.fullmatch(r"rank 0 of 2: the all-reduce of bucket [123]/3 \((b2, W2|b1|W1)\) failed after [\d.]+ s: "
                        r"another rank died, left or did not answer within 20 s \(.+\)", message), message
    assert time.monotonic() - start < LIMIT


def test_a_rank_that_never_joins_gives_a_one_line_error_within_the_timeout(tmp_path, monkeypatch):
    """Rank 0 of 2 alone, in this process: joining fails after the timeout and leaves no group."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    start = time.monotonic()
    with pytest.raises(engine.DistributedError) as failure:
        distributed.init("cpu", timeout=2, init_method=f"file://{tmp_path}/store")
    assert time.monotonic() - start < 30
    message = str(failure.value)
    assert "\n" not in message and message.startswith("rank 0 of 2: the process group did not form after ")
    assert "not every rank joined within 2 s" in message
    assert not torch.distributed.is_initialized() and distributed.world_size() == 1


def test_an_attach_set_that_differs_is_named_at_the_first_backward(tmp_path):
    results = spawn("attach", tmp_path)
    for r in (0, 1):
        assert one_line_error(results[r]) == (
            f"rank {r} of 2: ranks disagree at the first backward: the attach set differs: "
            "'b2' goes through the all-reduce on rank 0 but not on rank 1")
