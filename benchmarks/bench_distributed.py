"""Step time of 2-process data-parallel training: GradManager + make_allreduce_cb vs torch DistributedDataParallel.

Both sides train the same torch module (bench_engine's MLP and transformer block, and a tiny MLP) on the same
per-rank shards with SGD, over gloo on loopback, one torch thread per process. GradManager runs
the module's ONNX export. Runs alternate the two sides (both ranks follow the same schedule);
each run times `steps` steps on rank 0 (wall time, and the process's CPU time, steadier on a
loaded machine); the ratio is the median of the per-run ratios.

    python benchmarks/bench_distributed.py [--runs 15] [--steps 10] [--world 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import write_json  # noqa: E402
from bench_engine import cases, export  # noqa: E402

import engine  # noqa: E402
from engine import distributed  # noqa: E402


def all_cases():
    """bench_engine's MLP and transformer block, and a tiny MLP (sample_models/mlp.onnx's 8-16-3 shape)
    whose step is all fixed costs: Python, hooks, collective latency."""
    torch.manual_seed(0)
    tiny = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    return [(n, m, x) for n, m, x in cases() if n != "small_cnn"] + [("tiny_mlp", tiny, torch.randn(4, 8))]


def loss_fn(name: str, y: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(y, labels) if name.endswith("mlp") else y.square().mean()


def trainers(name: str, module: nn.Module, x: torch.Tensor, rank: int):
    """(ddp_step, gm_step, check): one SGD step each; `check` compares their first gradients."""
    with torch.no_grad():  # distinct values, so the exporter cannot merge equal initializers (LayerNorm ones)
        for p in module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model = engine.load(export(module, x))
    params = dict(module.named_parameters())
    weights = [n for n in model.graph.initializers if n in params]
    assert len(weights) == len(params), f"{name}: parameters missing from the ONNX initializers"
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own shard
    shard = torch.randn(x.shape, generator=gen)
    labels = torch.randint(0, 10, (x.shape[0],), generator=gen)

    gm = engine.GradManager(model)
    distributed.broadcast_params(gm)
    allreduce = distributed.make_allreduce_cb("MEAN")
    gm.attach(weights, callbacks=allreduce)
    gm_opt = torch.optim.SGD([gm.params[n] for n in weights], lr=1e-3)

    ddp = DistributedDataParallel(module)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def gm_step():
        with gm:
            out = gm.run({"x": shard})
            gm.backward(loss_fn(name, out["y"], labels))
        gm_opt.step()
        gm_opt.zero_grad()

    def ddp_step():
        loss_fn(name, ddp(shard), labels).backward()
        ddp_opt.step()
        ddp_opt.zero_grad()

    def check():
        with gm:
            out = gm.run({"x": shard})
            gm.backward(loss_fn(name, out["y"], labels))
        loss_fn(name, ddp(shard), labels).backward()
        for n in weights:  # the same averaged gradient on both sides, or the timing compares different work
            torch.testing.assert_close(gm.grad[n], params[n].grad, rtol=1e-3, atol=1e-4 * float(params[n].grad.abs().max()))
        gm_opt.zero_grad()
        ddp_opt.zero_grad()
        return allreduce

    return ddp_step, gm_step, check


def timed(step, steps: int) -> tuple[float, float]:
    """Seconds per step: wall time, and this process's CPU time (steadier on a loaded machine)."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def rank_main(args) -> None:
    torch.set_num_threads(1)
    distributed.init("cpu", timeout=120, init_method=f"file://{args.store}")
    rank = dist.get_rank()
    rows = []
    for name, module, x in all_cases():
        if name not in args.cases:
            continue
        ddp_step, gm_step, check = trainers(name, module, x, rank)
        stats = check().last_backward
        for _ in range(2):
            timed(gm_step, args.steps), timed(ddp_step, args.steps)
        pairs = []
        for r in range(args.runs):
            if r % 2:
                d, g = timed(ddp_step, args.steps), timed(gm_step, args.steps)
            else:
                g, d = timed(gm_step, args.steps), timed(ddp_step, args.steps)
            pairs.append((g, d))
        rows.append({"case": name, "params": sum(p.numel() for p in module.parameters()),
                     "buckets": stats.buckets, "sent_during_backward": stats.sent_during_backward,
                     "gm_ms": 1e3 * statistics.median(g[0] for g, _ in pairs),
                     "ddp_ms": 1e3 * statistics.median(d[0] for _, d in pairs),
                     "ratio": statistics.median(g[0] / d[0] for g, d in pairs),
                     "gm_cpu_ms": 1e3 * statistics.median(g[1] for g, _ in pairs),
                     "ddp_cpu_ms": 1e3 * statistics.median(d[1] for _, d in pairs),
                     "cpu_ratio": statistics.median(g[1] / d[1] for g, d in pairs),
                     "pairs_ms": [(1e3 * g[0], 1e3 * d[0]) for g, d in pairs]})
    if rank == 0:
        print(f"{'case':<20}{'params':>9}{'buckets':>8}{'gm ms':>9}{'ddp ms':>9}{'ratio':>8}"
              f"{'gm cpu':>9}{'ddp cpu':>9}{'ratio':>8}")
        for r in rows:
            print(f"{r['case']:<20}{r['params']:>9}{r['buckets']:>8}{r['gm_ms']:>9.2f}{r['ddp_ms']:>9.2f}{r['ratio']:>8.3f}"
                  f"{r['gm_cpu_ms']:>9.2f}{r['ddp_cpu_ms']:>9.2f}{r['cpu_ratio']:>8.3f}")
        meta = {"world": dist.get_world_size(), "backend": "gloo", "machine": platform.machine(), "cpus": os.cpu_count(),
                "torch": torch.__version__, "threads": 1, "runs": args.runs, "steps": args.steps,
                "loadavg_end": os.getloadavg()}
        write_json(args.json, {"meta": meta, "results": rows})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--cases", default="mlp,transformer_block,tiny_mlp")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "distributed.json"))
    p.add_argument("--store", help=argparse.SUPPRESS)  # set for the ranks this script starts
    args = p.parse_args(argv)
    if args.store:
        args.cases = args.cases.split(",")
        return rank_main(args)
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, WORLD_SIZE=str(args.world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        command = [sys.executable, os.path.abspath(__file__), "--store", os.path.join(folder, "store"),
                   "--runs", str(args.runs), "--steps", str(args.steps), "--cases", args.cases, "--json", args.json]
        procs = [subprocess.Popen(command, env=dict(env, RANK=str(r))) for r in range(args.world)]
        try:
            codes = [p.wait(timeout=1800) for p in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    print(f"load average at end: {os.getloadavg()}")
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")


if __name__ == "__main__":
    main()
