"""Prepared gradient call vs native PyTorch autograd on the identical math.

Each torch module is exported to ONNX (TorchScript exporter), loaded with the engine, and both sides
compute dy/d(input and every parameter) with the same seed dy. Timing: paired runs alternating the
two sides; each run times `calls` calls; the reported ratio is the median of the per-pair ratios.

    python benchmarks/bench_engine.py [--runs 15] [--calls 20] [--device cpu] [--json FILE]
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

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import write_json  # noqa: E402

import engine  # noqa: E402


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "engine.json"))
    args = p.parse_args(argv)
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
