"""`Model.jvp` and `Model.hvp` against torch.func on the very module that was exported (issue 36).

J·v: `Model.jvp` (numpy in, numpy out) vs `torch.func.jvp` of the module as a function of the same
tensors. H·v: `Model.hvp` vs `torch.func.jvp(torch.func.grad(loss))` (forward over reverse), the loss
Σ y² written into the ONNX file as two nodes and into torch as the same expression. Both sides run
with the same torch thread count; CPU time, the sides taking turns (benchmarks/_timing.py), medians
of --runs; values are compared before anything is timed.

Models: the millisecond models of bench_engine (MLP, CNN, transformer block, nn.TransformerEncoderLayer;
x in xs, a scalar loss) and, with --scale, BERT-base and GPT-2 124M (benchmarks/_scale_models.py; xs =
the first block's MLP weight, 32 tokens).

    python benchmarks/bench_forward.py [--runs 5] [--threads 1] [--scale] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import warnings

import numpy as np
import onnx
import torch
from onnx import helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _results import write_json  # noqa: E402
from _timing import interleaved  # noqa: E402

import engine  # noqa: E402

DEFAULT_JSON = os.path.join(HERE, "results", "forward.json")


def squared_loss(proto: onnx.ModelProto, y: str) -> onnx.ModelProto:
    """The model with loss = ReduceSum(y * y) appended (a scalar for H·v)."""
    g = proto.graph
    g.node.extend([helper.make_node("Mul", [y, y], ["hvp_sq"], name="hvp_square"),
                   helper.make_node("ReduceSum", ["hvp_sq"], ["hvp_loss"], name="hvp_sum", keepdims=0)])
    g.output.append(helper.make_tensor_value_info("hvp_loss", onnx.TensorProto.FLOAT, []))
    return proto


def rel(a, b) -> float:
    a, b = np.ravel(np.asarray(a, np.float64)), np.ravel(np.asarray(b, np.float64))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def measure(name, model, y, xs, zs, feeds, f, primal, runs, loss_model=None):
    """f(*primal) is y as torch computes it from the tensors of xs (in order)."""
    rng = np.random.default_rng(0)
    tangents = {x: rng.standard_normal(p.shape).astype(np.float32) for x, p in zip(xs, primal)}
    t_tangents = tuple(torch.from_numpy(tangents[x]) for x in xs)
    got = model.jvp(y, xs, tangents, zs, feeds=feeds)
    with torch.no_grad():
        _, want = torch.func.jvp(f, primal, t_tangents)
    row = {"case": name, "nodes": len(model.graph.nodes), "jvp_rel_error": rel(got.jvp, want)}
    times = interleaved({"ours": lambda: model.jvp(y, xs, tangents, zs, feeds=feeds),
                         "torch": lambda: torch.func.jvp(f, primal, t_tangents)}, runs)
    row.update(jvp_ours_ms=1e3 * times["ours"], jvp_torch_ms=1e3 * times["torch"],
               jvp_ratio=times["ours"] / times["torch"])
    if loss_model is not None:
        def loss(*values):
            out = f(*values)
            return (out * out).sum()

        grad = torch.func.grad(loss, argnums=tuple(range(len(xs))))
        got = loss_model.hvp("hvp_loss", xs, tangents, zs, feeds=feeds)
        _, want = torch.func.jvp(grad, primal, t_tangents)
        row["hvp_rel_error"] = rel(np.concatenate([got.hvp[x].ravel() for x in xs]),
                                   np.concatenate([w.detach().numpy().ravel() for w in want]))
        times = interleaved({"ours": lambda: loss_model.hvp("hvp_loss", xs, tangents, zs, feeds=feeds),
                             "torch": lambda: torch.func.jvp(grad, primal, t_tangents)}, runs)
        row.update(hvp_ours_ms=1e3 * times["ours"], hvp_torch_ms=1e3 * times["torch"],
                   hvp_ratio=times["ours"] / times["torch"])
    print(f"{name:12s} J·v {row['jvp_ours_ms']:8.2f} ms vs torch {row['jvp_torch_ms']:8.2f} ms: "
          f"{row['jvp_ratio']:.2f}x (error {row['jvp_rel_error']:.1e})"
          + (f"   H·v {row['hvp_ours_ms']:8.2f} vs {row['hvp_torch_ms']:8.2f} ms: {row['hvp_ratio']:.2f}x "
             f"(error {row['hvp_rel_error']:.1e})" if "hvp_ratio" in row else ""), flush=True)
    return row


def small(runs: int) -> list[dict]:
    from bench_engine import export, small_cases

    rows = []
    for name, module, x in small_cases():
        module.eval()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.01 * torch.randn_like(p))
                p.requires_grad_(False)  # torch records no tape for them, as the engine does not
        data = export(module, x)
        model = engine.load(data)
        loss_model = engine.load(squared_loss(onnx.load_from_string(data), "y"))

        def f(x_, module=module):
            return module(x_)

        rows.append(measure(name, model, "y", ["x"], [], {"x": x.numpy()}, f, (x,), runs, loss_model))
    return rows


def scale(runs: int) -> list[dict]:
    import _scale_models as sm

    rows = []
    for name in ("bert_base", "gpt2"):
        case = sm.case(name)
        if not case.built:
            sm.ensure([name], quiet=True)
        wrapped = sm.module(case).requires_grad_(False)
        model = engine.load(case.path)
        weight = sm.deep_weight(model.graph, case)
        param = sm.deep_parameter(case, wrapped)
        value = torch.from_numpy(np.array(model.constants()[weight]))
        transposed = value.shape != param.shape
        assert torch.equal(value.T if transposed else value, param.detach()), f"{name}: {weight} is not {case.deep}"
        feeds = sm.example(case)
        args = tuple(torch.from_numpy(feeds[n]) for n in case.inputs)
        pname = "model." + case.deep + ".weight"

        def f(w, wrapped=wrapped, pname=pname, args=args, transposed=transposed):
            return torch.func.functional_call(wrapped, {pname: w.T if transposed else w}, args)

        loss_model = None
        if not case.external:
            loss_model = engine.load(squared_loss(onnx.load(case.path), case.output))
        rows.append(measure(name, model, case.output, [weight], list(case.inputs), feeds, f, (value,), runs,
                            loss_model))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scale", action="store_true", help="also BERT-base and GPT-2 124M")
    p.add_argument("--json", default=DEFAULT_JSON)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    # torch's inference fast paths (nn.TransformerEncoderLayer's fused kernel) have no forward rule
    torch.backends.mha.set_fastpath_enabled(False)
    warnings.filterwarnings("ignore")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # torch's flash kernel has no forward rule; the engine uses math too
        rows = small(args.runs) + (scale(args.runs) if args.scale else [])
    write_json(args.json, {"benchmark": "forward", "runs": args.runs, "threads": args.threads,
                           "machine": platform.processor() or platform.machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
