"""`Model.gradient` vs torch eager forward+backward on real architectures (timm, transformers).

Each model (small config, random perturbed weights, eval mode) is exported by both torch
exporters; onnxgrad computes dy/d(input if float, every float initializer) through the public
`Model.gradient` (numpy in, numpy out), torch computes dy/d(input, every parameter) on the very
module that was exported, with the same dy. Gradients are compared first (initializers matched to
parameters by value), in float32 as run and again with both sides in float64: a float32 error
with no float64 one is a Relu kink whose side float32 round-off decides (densenet121), not a wrong
op. Timing: process CPU time with one torch thread (--threads), paired runs
alternating the sides, each timing `calls` calls; the ratio is the median of per-pair ratios.
Plan modes: `interpret` (the step list, the old path), `fx` (the default) and, with --compile,
`compile` (torch.compile on the fx module).

    python benchmarks/bench_real.py [--runs 7] [--models bert,resnet18] [--compile] [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _real_models as real_models  # noqa: E402
from _results import write_json  # noqa: E402

import engine  # noqa: E402
from engine.run import plan as plan_module  # noqa: E402


def gradient_xs(model, module, x_name: str) -> list[str]:
    """The input if it is float, then every float initializer that is not a scalar nor one of the
    module's buffers (BatchNorm running statistics: torch differentiates parameters only)."""
    consts = model.constants()
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    xs = [x_name] if model.graph.types[x_name].elem_type == 1 else []
    return xs + [n for n, v in consts.items() if v.is_floating_point() and v.dim() >= 1 and v.numel() >= 2
                 and not any(b.shape == v.shape and torch.equal(b, v) for b in buffers)]


def setup(case, exporter: str, mode: str):
    module, x = real_models.build(case)
    model = engine.load(real_models.export(module, x, exporter))
    for p in model._plans.values():
        p.mode = mode
    (name,) = model.inputs
    y_name = model.outputs[0]
    xs = gradient_xs(model, module, name)
    zs = [] if name in xs else [name]  # token ids: an input, not differentiated
    with torch.no_grad():
        y = module(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7))
    feeds, dy_np = {name: x.numpy()}, dy.numpy()
    leaves = ([x.clone().requires_grad_()] if x.is_floating_point() else []) + list(module.parameters())

    def ours():
        return model.gradient(y_name, xs, zs, feeds=feeds, dy=dy_np)

    def native():
        out = module(leaves[0] if x.is_floating_point() else x)
        return torch.autograd.grad(out, leaves, dy)

    def exact():
        """Both sides in float64: Relu kinks decided by float32 round-off cannot flip there."""
        wide = copy.deepcopy(module).double()
        xd = x.double().requires_grad_() if x.is_floating_point() else x
        leaves64 = ([xd] if x.is_floating_point() else []) + list(wide.parameters())
        native64 = torch.autograd.grad(wide(xd), leaves64, dy.double())
        return model.gradient(y_name, xs, zs, feeds=feeds, dy=dy_np, dtype="float64"), native64

    return module, model, x, xs, ours, native, exact


def check(module, model, x, ours_result, native_grads) -> tuple[int, float]:
    """Gradients compared where an initializer is a parameter by value (and for the input): how
    many, and the worst error relative to each gradient's largest element."""
    params = dict(module.named_parameters())
    names = list(params)
    offset = 1 if x.is_floating_point() else 0
    by_name = {n: native_grads[offset + i] for i, n in enumerate(names)}
    pairs = []
    # MaxPool after Relu meets ties (all-zero windows), where each side may route the gradient to a
    # different element: the input's gradient is then compared by the weights' gradients only.
    if offset and "MaxPool" not in {n.op_type for n in model.graph.nodes}:
        pairs.append((ours_result.grads[model.inputs[0]], native_grads[0]))
    for init, (pname, transposed) in real_models.match_weights(model, module).items():
        if init in ours_result.grads:
            g = by_name[pname]
            pairs.append((ours_result.grads[init], g.t() if transposed else g))
    # Some gradients vanish mathematically (a key bias under softmax): judge those on the model's scale.
    scale = max(float(b.abs().max()) for _, b in pairs)
    worst = 0.0
    for a, b in pairs:
        b = b.numpy()
        worst = max(worst, float(np.abs(a - b).max()) / (float(np.abs(b).max()) + 1e-3 * scale))
    return len(pairs), worst


def timed(fn, calls: int) -> float:
    """Process CPU time per call (one torch thread): steadier than wall time on a shared machine."""
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls


def bench(case, exporter: str, mode: str, runs: int) -> dict:
    plan_module.DEFAULT_MODE = mode
    try:
        module, model, x, xs, ours, native, exact = setup(case, exporter, mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = ours()
            compared, worst = check(module, model, x, result, native())
            worst64 = check(module, model, x, *exact())[1]
            for _ in range(2):
                ours(), native()
    finally:
        plan_module.DEFAULT_MODE = "fx"
    once = timed(native, 1)
    calls = max(2, min(50, int(0.1 / max(once, 1e-5))))
    pairs = []
    for r in range(runs):
        if r % 2:
            n_t, o_t = timed(native, calls), timed(ours, calls)
        else:
            o_t, n_t = timed(ours, calls), timed(native, calls)
        pairs.append((o_t, n_t))
    return {"model": case.name, "exporter": exporter, "mode": mode, "nodes": len(model.graph.nodes),
            "xs": len(xs), "compared": compared, "grad_err": worst, "grad_err64": worst64,
            "ours_ms": 1e3 * statistics.median(o for o, _ in pairs),
            "torch_ms": 1e3 * statistics.median(n for _, n in pairs),
            "ratio": statistics.median(o / n for o, n in pairs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--models", default="", help="comma-separated subset of: "
                   + ", ".join(c.name for c in real_models.CASES))
    p.add_argument("--exporters", default=",".join(real_models.EXPORTERS))
    p.add_argument("--modes", default="interpret,fx")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile on the fx module")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "real.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not real_models.available():
        sys.exit("bench_real needs timm and transformers (not project dependencies)")
    wanted = set(filter(None, args.models.split(",")))
    modes = args.modes.split(",") + (["compile"] if args.compile else [])
    rows = []
    print(f"{'model':<16}{'exporter':<12}{'mode':<10}{'nodes':>6}{'xs':>5}{'grad err':>10}{'f64 err':>10}"
          f"{'ours ms':>10}{'torch ms':>10}{'ratio':>8}")
    for case in real_models.CASES:
        if wanted and case.name not in wanted:
            continue
        for exporter in args.exporters.split(","):
            for mode in modes:
                r = bench(case, exporter, mode, args.runs)
                rows.append(r)
                print(f"{r['model']:<16}{r['exporter']:<12}{r['mode']:<10}{r['nodes']:>6}{r['xs']:>5}"
                      f"{r['grad_err']:>10.1e}{r['grad_err64']:>10.1e}"
                      f"{r['ours_ms']:>10.2f}{r['torch_ms']:>10.2f}{r['ratio']:>8.3f}", flush=True)
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "runs": args.runs, "load": os.getloadavg()[0]}
    if args.json:
        write_json(args.json, {"meta": meta, "results": rows})
    return rows


if __name__ == "__main__":
    main()
