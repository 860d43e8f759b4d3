"""Lowered JVPs (`onnxgrad lower --jvp`): onnxruntime's time for the lowered model ÷ the model's own forward,
and its J·v against the engine's `Model.jvp`, on the sample models and the real architectures.

    python benchmarks/bench_lower_jvp.py [--runs 7] [--real [--image N]] [--only a,b] [--all-weights] [--gpt2]

Both sessions run on onnxruntime's CPU provider with the same threads, taking turns call by call; the
ratio is the median of per-pair ratios, of CPU time with one thread (the default: onnxruntime then runs in
the calling thread, and the thread's CPU time is what other jobs on a shared machine leave alone), of
wall time with more. "forward" is the model as lowering prepares it (contrib ops written
out, Gradient nodes lowered), with its own outputs. xs: the sample's check selection; a real
architecture's float input, or for token ids its first float weight (the embedding table), or with
--all-weights the input and every float weight (the VJP survey's xs, benchmarks/_real_lowering.py).
The match is the relative L2 norm of onnxruntime's J·v against the engine's in float32; beyond 1e-4, the engine
also runs the lowered model itself (same forward, same Relu and MaxPool branches as its own J·v), as
benchmarks/_real_lowering.py does for gradients. With --image N, the image models are exported again at
N×N (batch 1), where the convolutions rather than per-node overheads set the time. Results go to
benchmarks/results/lower_jvp.json.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _results import write_json  # noqa: E402
from bench_lower import paired  # noqa: E402

import engine  # noqa: E402
from engine.lowering.build import finished, prepared  # noqa: E402
from engine.lowering.jvp import lower_jvp  # noqa: E402

L2_TOL = 1e-4  # float32, relative L2 (issue 36's target)
GPT2 = os.path.join(os.path.expanduser("~"), ".cache", "onnxgrad-bench", "scale", "gpt2-v1", "gpt2.onnx")


def sample_cases():
    from tests.run.test_samples import SAMPLES, _path

    for name, s in SAMPLES.items():
        model = engine.load(_path(name))
        feeds = {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)} \
            if "X" in s.feeds else {}
        inner = [m for m in s.xs + s.zs if m in model.graph.producer]
        values = model.run(feeds, outputs=inner) if inner else {}
        yield name, onnx.load(_path(name)), s.y, list(s.xs), list(s.zs), {**feeds, **values}


def real_cases(all_weights: bool, image: int = 0, only=frozenset()):
    import _real_lowering
    import _real_models

    if not _real_models.available():  # also stubs torchvision, which transformers' imports need
        print("timm / transformers do not import: no real architectures", flush=True)
        return
    for case in _real_models.LOWERING_CASES:
        for exporter in _real_models.EXPORTERS:
            if (image and case.example().dim() != 4) or (only and f"{case.name}_{exporter}" not in only):
                continue  # not exported at all
            try:
                if image:
                    proto, model, y, xs, zs, feeds = at_size(case, exporter, image)
                else:
                    proto, model, y, xs, zs, feeds, _ = _real_lowering.prepared(case, exporter)
            except Exception as exc:  # noqa: BLE001 - an export that fails is reported, not fatal
                print(f"{case.name}_{exporter}: export failed: {str(exc).splitlines()[0][:200]}", flush=True)
                continue
            (x_name,) = feeds
            if not all_weights:
                xs = [x_name] if x_name in xs else xs[:1]
                zs = [] if x_name in xs else [x_name]
            yield f"{case.name}_{exporter}", proto, y, xs, zs, feeds


def at_size(case, exporter: str, size: int):
    """(proto, model, y, xs, zs, feeds) of an image architecture exported at size × size, batch 1."""
    import _real_lowering
    import _real_models
    import torch

    module, _ = _real_models.build(case)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    # a cache of its own: the export cache keys an input by its first bytes, which a seeded larger input shares
    cache = os.path.join(_real_models.CACHE, f"size{size}")
    proto = onnx.load_from_string(_real_models.export(module, x, exporter, cache=cache))
    model = engine.load(proto)
    (x_name,) = model.inputs
    return proto, model, model.outputs[0], _real_lowering.gradient_xs(model, module, x_name), [], {x_name: x.numpy()}


def gpt2_case():
    proto = onnx.load(GPT2)
    model = engine.load(GPT2)
    ids = model.inputs[0]
    feeds = {ids: np.random.default_rng(0).integers(0, 50257, (1, 32)).astype(np.int64)}
    feeds.update({i: np.ones((1, 32), np.int64) for i in model.inputs[1:]})  # attention_mask
    weight = next(n for n, v in model.constants().items() if v.is_floating_point() and v.dim() == 2)
    return "gpt2_124m", proto, model.outputs[0], [weight], list(feeds), feeds


def forward_of(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model as lowering prepares it (what its JVP is built beside), with its own outputs."""
    graph, state = prepared(proto, selection=True)
    out, data = finished(graph, state, check=False)
    from engine.modelfile.writer import materialize

    return materialize(out, data)


def session(proto: onnx.ModelProto, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    s = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return s, {i.name for i in s.get_inputs()}


def measure(name, proto, y, xs, zs, feeds, runs: int, threads: int) -> dict:
    model = engine.load(proto)
    start = time.perf_counter()
    try:
        lowered = lower_jvp(proto, y, xs, zs)
    except Exception as exc:  # noqa: BLE001 - the survey reports every refusal in one line
        return {"problem": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
    lower_s = time.perf_counter() - start
    want = model.jvp(y, xs, "random", zs, feeds=feeds)
    tangents = {f"t_{x}": v for x, v in want.tangents.items()}
    jvp_session, jvp_names = session(lowered, threads)
    jvp_feeds = {k: v for k, v in {**feeds, **tangents}.items() if k in jvp_names}
    got = dict(zip([o.name for o in jvp_session.get_outputs()], jvp_session.run(None, jvp_feeds)))[f"jvp_{y}"]
    l2 = rel_l2(got, want.jvp)
    same_forward = None
    if l2 > L2_TOL:  # onnxruntime's float32 forward may take other Relu / MaxPool branches than torch's
        same = engine.load(lowered).run({**feeds, **tangents}, outputs=[f"jvp_{y}"])[f"jvp_{y}"]
        same_forward = rel_l2(same, want.jvp)
    fwd_session, fwd_names = session(forward_of(proto), threads)
    fwd_feeds = {k: v for k, v in feeds.items() if k in fwd_names}
    # one onnxruntime thread runs in the caller's: its CPU time, which other jobs on the machine do not inflate
    clock = time.thread_time if threads == 1 else time.perf_counter
    t_jvp, t_fwd, ratio = paired(functools.partial(jvp_session.run, None, jvp_feeds),
                                 functools.partial(fwd_session.run, None, fwd_feeds), runs, clock)
    ops = {}
    for n in lowered.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"xs": len(xs), "nodes_forward": len(proto.graph.node), "nodes_lowered": len(lowered.graph.node),
            "lower_s": lower_s, "jvp_ort_s": t_jvp, "forward_ort_s": t_fwd, "jvp_over_forward": ratio,
            "rel_l2_vs_engine": l2, "jvp_norm": float(np.linalg.norm(want.jvp)),
            **({"same_forward_l2": same_forward} if same_forward is not None else {})}


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def main() -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime threads for both sessions (0: its default)")
    ap.add_argument("--real", action="store_true", help="also the timm / transformers architectures, both exporters")
    ap.add_argument("--all-weights", action="store_true", help="real models: xs = the input and every float weight")
    ap.add_argument("--image", type=int, default=0, help="real image models only, exported at N×N, batch 1")
    ap.add_argument("--gpt2", action="store_true", help=f"also GPT-2 124M ({GPT2}, built by bench_scale.py)")
    ap.add_argument("--no-samples", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "lower_jvp.json"))
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    results = {"runs": args.runs, "threads": args.threads, "onnxruntime": ort.__version__,
               "clock": "thread CPU time" if args.threads == 1 else "wall time",
               "all_weights": args.all_weights, "models": {}}
    groups = [] if args.no_samples else [sample_cases()]
    if args.real:
        groups.append(real_cases(args.all_weights, args.image, only))
    if args.gpt2:
        groups.append([gpt2_case()])
    for group in groups:
        for name, proto, y, xs, zs, feeds in group:
            if only and name not in only:
                continue
            entry = measure(name, proto, y, xs, zs, feeds, args.runs, args.threads)
            results["models"][name] = entry
            print(name, {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in entry.items()}, flush=True)
    write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
