"""Prepared gradient call vs native PyTorch autograd on the identical math.

Each torch module is exported to ONNX (TorchScript exporter), loaded with the engine, and both sides
compute dy/d(input and every parameter) with the same seed dy. Timing: paired runs alternating the
two sides; each run times `calls` calls; the reported ratio is the median of the per-pair ratios.

    python benchmarks/bench_engine.py [--runs 15] [--calls 20] [--device cpu] [--json FILE]
    python benchmarks/bench_engine.py --small [--runs 41] [--calls 10] [--threads 1 2]   # results/engine_small.json
    python benchmarks/bench_engine.py --small --breakdown [--runs 201]   # where the time goes (1 thread)

--small: millisecond models (MLP, CNN, transformer block) with x alone in xs and a scalar loss:
torch eager, the prepared gradient and `Model.gradient`, numpy in and numpy out on all three.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import write_json  # noqa: E402

import engine  # noqa: E402

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "engine.json")


class Block(nn.Module):
    """One pre-norm transformer block written out (MatMul, Softmax, LayerNorm, Gelu/Erf, residuals)."""

    def __init__(self, d=128, heads=4, ff=512):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.h, self.dk).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / self.dk ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


def cases():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(64, 10))
    return [("mlp", mlp, torch.randn(64, 256)), ("small_cnn", cnn, torch.randn(16, 3, 32, 32)),
            ("transformer_block", Block(), torch.randn(8, 64, 128))]


def export(module, x) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # No constant folding: BatchNorm stays a node and every parameter keeps its name and its own slot.
        torch.onnx.export(module, (x,), buf, input_names=["x"], output_names=["y"], opset_version=20, dynamo=False,
                          do_constant_folding=False)
    return buf.getvalue()


def bench_case(name, module, x, runs, calls, device):
    module.eval().to(device)
    with torch.no_grad():  # distinct values, so the exporter cannot merge equal initializers (LayerNorm ones)
        for p in module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    x = x.to(device)
    model = engine.load(export(module, x))
    params = dict(module.named_parameters())
    weights = [n for n in model.graph.initializers if n in params]
    prepared = model.prepare_gradient("y", ["x"] + weights, device=device)
    consts = model.constants(device)
    ours_inputs = [x] + [consts[n] for n in weights]
    native_leaves = [x.detach().requires_grad_()] + [params[n] for n in weights]
    dy = torch.randn_like(module(x))

    def ours():
        return prepared(*ours_inputs, dy=dy).grads

    def native():
        y = torch.func.functional_call(module, {n: p for n, p in zip(weights, native_leaves[1:])}, (native_leaves[0],))
        return torch.autograd.grad(y, native_leaves, dy)

    # Same numbers on both sides, or the timing compares different math.
    assert len(weights) == len(params), f"{name}: parameters missing from the ONNX initializers"
    for a, b in zip(ours(), native()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4 * float(b.abs().max()))

    def timed(fn):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / calls

    for _ in range(3):
        timed(ours), timed(native)
    pairs = []
    for r in range(runs):
        if r % 2:
            n_t, o_t = timed(native), timed(ours)
        else:
            o_t, n_t = timed(ours), timed(native)
        pairs.append((o_t, n_t))
    ratio = statistics.median(o / n for o, n in pairs)
    return {"case": name, "nodes": len(model.graph.nodes), "xs": 1 + len(weights),
            "ours_ms": 1e3 * statistics.median(o for o, _ in pairs),
            "native_ms": 1e3 * statistics.median(n for _, n in pairs), "ratio": ratio}


class Regression(nn.Module):
    """A scalar loss on a module's output: the mean squared distance to a fixed target (a constant
    in the export). Not the mean of squares alone: after a final LayerNorm that is nearly constant."""

    def __init__(self, module, x):
        super().__init__()
        self.module = module
        with torch.no_grad():
            self.register_buffer("target", torch.randn_like(module(x)))

    def forward(self, x):
        return ((self.module(x) - self.target) ** 2).mean()


def small_cases():
    """Millisecond models, x alone in xs, a scalar loss: where per-call overhead shows. The
    encoder layer is torch's own nn.TransformerEncoderLayer (a neighbour of the written-out block)."""
    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(16, 10))
    encoder = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    cases = [("mlp_ms", mlp, torch.randn(32, 256)), ("cnn_ms", cnn, torch.randn(8, 3, 16, 16)),
             ("block_ms", Block(64, 4, 256), torch.randn(4, 32, 64)), ("encoder_ms", encoder, torch.randn(4, 32, 64))]
    return [(name, Regression(module.eval(), x), x) for name, module, x in cases]


def bench_small(name, module, x, runs, calls, threads):
    """torch eager, the prepared gradient and Model.gradient on dloss/dx, numpy in and out, the three
    taking turns (order rotated run by run); ratios are medians of the per-run ratios to eager."""
    torch.set_num_threads(threads)
    module.eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model = engine.load(export(module, x))
    x_np = x.numpy()
    prepared = model.prepare_gradient("y", ["x"])

    def eager():
        leaf = torch.from_numpy(x_np).requires_grad_()
        return torch.autograd.grad(module(leaf), leaf)[0].numpy()

    def ours_prepared():
        return prepared(torch.from_numpy(x_np)).grads[0].numpy()

    def ours_gradient():
        return model.gradient("y", ["x"], feeds={"x": x_np}).grads["x"]

    fns = {"eager": eager, "prepared": ours_prepared, "gradient": ours_gradient}
    for fn in fns.values():
        np.testing.assert_allclose(fn(), eager(), rtol=1e-3, atol=1e-5 * float(np.abs(eager()).max()))
    for _ in range(3):
        for fn in fns.values():
            for _ in range(calls):
                fn()
    order = list(fns)
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for r in range(runs):
        for k in order[r % 3:] + order[:r % 3]:
            c, t = time.process_time(), time.perf_counter()
            for _ in range(calls):
                fns[k]()
            wall[k].append((time.perf_counter() - t) / calls)
            cpu[k].append((time.process_time() - c) / calls)
    row = {"case": name, "threads": threads, "nodes": len(model.graph.nodes), "load_average": os.getloadavg()[0]}
    for k in fns:
        row[f"{k}_ms"] = 1e3 * statistics.median(wall[k])
        row[f"{k}_cpu_ms"] = 1e3 * statistics.median(cpu[k])
    for k in ("prepared", "gradient"):
        row[f"{k}_ratio"] = statistics.median(a / b for a, b in zip(wall[k], wall["eager"]))
        row[f"{k}_cpu_ratio"] = statistics.median(a / b for a, b in zip(cpu[k], cpu["eager"]))
    return row


def breakdown(name, module, x, runs):
    """Where a call's time goes, 1 thread: thread CPU medians (forwards alone, without autograd;
    whole calls) and Python function calls per call (cProfile counts: exact whatever the load)."""
    import cProfile
    import pstats

    torch.set_num_threads(1)
    model = engine.load(export(module.eval(), x))
    x_np = x.numpy()
    prepared = model.prepare_gradient("y", ["x"])
    plan = model.prepare(["x"], ["y"])
    leaf = torch.from_numpy(x_np).requires_grad_()

    def eager():
        a = torch.from_numpy(x_np).requires_grad_()
        return torch.autograd.grad(module(a), a)[0].numpy()

    fns = {"eager": eager, "prepared": lambda: prepared(torch.from_numpy(x_np)).grads[0].numpy(),
           "gradient": lambda: model.gradient("y", ["x"], feeds={"x": x_np}).grads["x"],
           "eager forward": lambda: module(leaf), "plan forward": lambda: plan.run([leaf])}
    row = {"case": name}
    for k in ("eager", "prepared", "gradient"):
        for _ in range(3):  # the plan's first run is interpreted, its second builds the fx module
            fns[k]()
        prof = cProfile.Profile()
        prof.runcall(fns[k])
        row[f"{k}_python_calls"] = pstats.Stats(prof).total_calls
    cpu = {k: [] for k in fns}
    for _ in range(10):
        for fn in fns.values():
            fn()
    for _ in range(runs):
        for k, fn in fns.items():
            t = time.thread_time()
            fn()
            cpu[k].append(time.thread_time() - t)
    for k in fns:
        row[k.replace(" ", "_") + "_cpu_ms"] = 1e3 * statistics.median(cpu[k])
    row["load_average"] = os.getloadavg()[0]
    return row


def main_breakdown(args):
    rows = [breakdown(n, m, x, args.runs) for n, m, x in small_cases()]
    print(f"{'case':<11}{'python calls (eager/prepared/gradient)':>40}{'fwd eager/plan ms':>20}"
          f"{'eager/prepared/gradient ms':>30}  load")
    for r in rows:
        calls = f"{r['eager_python_calls']} / {r['prepared_python_calls']} / {r['gradient_python_calls']}"
        fwd = f"{r['eager_forward_cpu_ms']:.3f} / {r['plan_forward_cpu_ms']:.3f}"
        whole = f"{r['eager_cpu_ms']:.3f} / {r['prepared_cpu_ms']:.3f} / {r['gradient_cpu_ms']:.3f}"
        print(f"{r['case']:<11}{calls:>40}{fwd:>20}{whole:>30}  {r['load_average']:.1f}")
    return rows


def main_small(args):
    rows = [bench_small(n, m, x, args.runs, args.calls, t) for t in args.threads for n, m, x in small_cases()]
    print(f"{'case':<10}{'thr':>4}{'eager ms':>10}{'prepared':>10}{'gradient':>10}  {'(cpu ratios, 1 thread)':>24}  load")
    for r in rows:
        cpu = f"{r['prepared_cpu_ratio']:.3f} / {r['gradient_cpu_ratio']:.3f}" if r["threads"] == 1 else ""
        print(f"{r['case']:<10}{r['threads']:>4}{r['eager_ms']:>10.3f}{r['prepared_ratio']:>10.3f}"
              f"{r['gradient_ratio']:>10.3f}  {cpu:>24}  {r['load_average']:.1f}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=DEFAULT_JSON)
    p.add_argument("--small", action="store_true",
                   help="the millisecond models instead (x alone in xs, scalar loss; eager / prepared / Model.gradient)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="with --small: torch thread counts")
    p.add_argument("--breakdown", action="store_true",
                   help="with --small: Python calls and thread CPU of forwards and whole calls, 1 thread")
    args = p.parse_args(argv)
    if args.small and args.breakdown:
        return main_breakdown(args)
    if args.small:
        path = args.json if args.json != DEFAULT_JSON else os.path.join(os.path.dirname(DEFAULT_JSON), "engine_small.json")
        rows = main_small(args)
        meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
                "runs": args.runs, "calls": args.calls,
                "timing": "wall (and process CPU) seconds per call, medians; ratios: medians of per-run ratios to eager"}
        write_json(path, {"meta": meta, "results": rows})
        return rows
    rows = [bench_case(n, m, x, args.runs, args.calls, args.device) for n, m, x in cases()]
    print(f"{'case':<20}{'nodes':>6}{'xs':>4}{'ours ms':>10}{'torch ms':>10}{'ratio':>8}")
    for r in rows:
        print(f"{r['case']:<20}{r['nodes']:>6}{r['xs']:>4}{r['ours_ms']:>10.3f}{r['native_ms']:>10.3f}{r['ratio']:>8.3f}")
    meta = {"device": args.device, "machine": platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "runs": args.runs, "calls": args.calls}
    if args.json:
        write_json(args.json, {"meta": meta, "results": rows})
    return rows


if __name__ == "__main__":
    main()
