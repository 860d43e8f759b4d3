"""Gradients three ways: onnxruntime on the model `engine.lower` writes, the engine itself (torch
autograd), and onnxruntime-training's own gradient graph (com.microsoft ops), as paired ratios.

    python benchmarks/bench_lower.py [--runs 15] [--ortt-python /tmp/ortt/bin/python] [--real] [--only a,b]

Each model's loss is scalar (a non-scalar output y gets loss = sum(y²)), so every side computes the
same gradients. Sides take turns call by call, so a loaded machine slows them alike; the ratios are
medians of per-pair ratios. onnxruntime-training needs Python <= 3.11 and lives in a side venv
(`python -m venv /tmp/ortt && /tmp/ortt/bin/pip install onnxruntime-training==1.19.2 onnx`): its
graph is built and timed there, paired with the lowered model on that venv's onnxruntime.
With --real, also the real architectures of benchmarks/_real_models.py (LOWERING_CASES: timm and
transformers, small configs, random weights, each by both torch exporters; xs = the input when float and
every float weight). Results go to benchmarks/results/lower.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _results import write_json  # noqa: E402

import engine  # noqa: E402
from engine.lowering.build import upgraded  # noqa: E402
from tests.lowering.test_light import _weights_as_inputs  # noqa: E402
from tests.run.test_light_models import _weights, _with_random_feeds  # noqa: E402

SAMPLES = {  # sample -> (y, xs, zs)
    "mlp": ("loss", ["W1", "b1", "W2", "b2"], ["X", "T"]),
    "small_cnn": ("logits", ["X", "conv1_W", "bn_scale", "bn_B", "fc_W"], []),
    "transformer_block": ("loss", ["X", "Wq", "Wk", "Wv", "Wo", "ln1_scale", "W1", "W2"], []),
}

ORTT_SCRIPT = r"""
import json, statistics, sys, time
import numpy as np, onnx, onnxruntime as ort
from onnxruntime.capi._pybind_state import GradientGraphBuilder
forward, lowered, feeds_path, loss, xs, runs = sys.argv[1:5] + [sys.argv[5].split(","), int(sys.argv[6])]
threads = int(sys.argv[7])
feeds = dict(np.load(feeds_path))
builder = GradientGraphBuilder(onnx.load(forward).SerializeToString(), {loss}, set(xs), loss)
builder.build()
options = ort.SessionOptions(); options.log_severity_level = 3
if threads: options.intra_op_num_threads = threads; options.inter_op_num_threads = 1
def session(data):
    s = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s, {k: v for k, v in feeds.items() if k in names}
trained, f1 = session(builder.get_model())
plain, f2 = session(onnx.load(lowered).SerializeToString())
outs = {o.name for o in trained.get_outputs()}
wanted = [x + "_grad" for x in xs]
got = dict(zip([o.name for o in trained.get_outputs()], trained.run(None, f1)))
mine = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, f2)))
err = max(float(np.abs(got[x + "_grad"] - mine["d" + loss + "_d" + x]).max()
              / max(1e-30, np.abs(got[x + "_grad"]).max())) for x in xs)
ratios, a_times, b_times = [], [], []
for _ in range(runs):
    t = time.perf_counter(); plain.run(None, f2); a = time.perf_counter() - t
    t = time.perf_counter(); trained.run(None, f1); b = time.perf_counter() - t
    ratios.append(a / b); a_times.append(a); b_times.append(b)
print(json.dumps({"lowered_s": statistics.median(a_times), "ortt_s": statistics.median(b_times),
                  "lowered_over_ortt": statistics.median(ratios), "max_rel_diff": err,
                  "ortt_version": ort.__version__, "ortt_nodes": len(onnx.load_from_string(builder.get_model()).graph.node)}))
"""


def with_scalar_loss(proto: onnx.ModelProto, y: str) -> tuple[onnx.ModelProto, str]:
    """Append loss = sum(y * y) when y is not already a scalar, so every side differentiates a scalar."""
    shape = next((vi.type.tensor_type.shape for vi in proto.graph.output if vi.name == y), None)
    if shape is not None and len(shape.dim) == 0:
        return proto, y
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    # Mul + ReduceSum rather than ReduceSumSquare, which onnxruntime-training cannot differentiate
    out.graph.node.append(helper.make_node("Mul", [y, y], ["bench_square"]))
    out.graph.node.append(helper.make_node("ReduceSum", ["bench_square"], ["bench_loss"], keepdims=0))
    out.graph.output.append(helper.make_tensor_value_info("bench_loss", onnx.TensorProto.FLOAT, []))
    return out, "bench_loss"


def real_cases():
    """(name, proto, y, xs, zs, feeds) of every real architecture by both exporters (weights fed as values)."""
    import _real_lowering
    import _real_models

    for case in _real_models.LOWERING_CASES:
        for exporter in _real_models.EXPORTERS:
            proto, model, y, xs, zs, feeds, _ = _real_lowering.prepared(case, exporter)
            values = {k: v.numpy() for k, v in model.constants().items() if k in xs}
            yield f"{case.name}_{exporter}", proto, y, xs, zs, {**feeds, **values}


def cases(real: bool = False):
    if real:
        import _real_models

        if _real_models.available():
            yield from real_cases()
        else:
            print("timm / transformers do not import: no real architectures", flush=True)
    for name, (y, xs, zs) in SAMPLES.items():
        proto = onnx.load(os.path.join(ROOT, "sample_models", f"{name}.onnx"))
        model = engine.load(proto)
        feeds = {k: v.numpy() for k, v in model.constants().items() if k in xs + zs}
        yield name, proto, y, xs, zs, feeds
    proto, model, image, feeds = _with_random_feeds("squeezenet", seed=1)
    xs = [image] + _weights(proto)
    cut = _weights_as_inputs(proto, feeds, image)
    for node in cut.graph.node:  # onnxruntime-training differentiates Dropout as in training (random masks)
        if node.op_type == "Dropout":
            node.op_type = "Identity"
            del node.attribute[:]
            del node.output[1:]
    yield "light_squeezenet", cut, model.outputs[0], xs, [w for w in feeds if w not in xs], feeds


def paired(a, b, runs: int, clock=time.perf_counter) -> tuple[float, float, float]:
    """Median seconds of a and of b, and the median of the per-pair ratios a / b (`clock`: time.thread_time
    counts only this thread's CPU time, which other jobs on a shared machine do not inflate, where a and b
    run in the calling thread)."""
    a(), b()  # warm-up
    ta, tb, ratios = [], [], []
    for _ in range(runs):
        t = clock()
        a()
        x = clock() - t
        t = clock()
        b()
        z = clock() - t
        ta.append(x)
        tb.append(z)
        ratios.append(x / z)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def main() -> int:
    import onnxruntime as ort
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--ortt-python", default="/tmp/ortt/bin/python")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "lower.json"))
    ap.add_argument("--real", action="store_true", help="also the timm / transformers architectures, both exporters")
    ap.add_argument("--only", default="", help="comma-separated case names (e.g. mlp,bert_dynamo)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for torch and every onnxruntime session (0: each library's default); one thread "
                         "keeps the sides comparable on a loaded machine")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {"runs": args.runs, "threads": args.threads, "torch_threads": torch.get_num_threads(),
               "onnxruntime": ort.__version__,
               "models": {}}
    tmp = tempfile.mkdtemp()
    only = set(filter(None, args.only.split(",")))
    for name, proto, y, xs, zs, feeds in cases(args.real):
        if only and name not in only:
            continue
        proto, loss = with_scalar_loss(proto, y)
        model = engine.load(proto)
        lowered = engine.lower(proto, loss, xs, zs)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if args.threads:
            options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        session = ort.InferenceSession(lowered.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in names}
        prepared = model.prepare_gradient(loss, xs, zs)
        values = [torch.from_numpy(np.asarray(feeds[n])) for n in prepared.input_names]
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, ort_feeds)))
        want = prepared(*values).grads
        diff = max(float(np.abs(got[f"d{loss}_d{x}"] - g.numpy()).max() / max(1e-30, float(g.abs().max())))
                   for x, g in zip(xs, want))
        # one relative L2 over every gradient at once: exact-zero gradients (round-off only) weigh nothing
        flat_got = np.concatenate([np.ravel(got[f"d{loss}_d{x}"]).astype(np.float64) for x in xs])
        flat_want = np.concatenate([g.numpy().ravel().astype(np.float64) for g in want])
        l2 = float(np.linalg.norm(flat_got - flat_want) / np.linalg.norm(flat_want))
        t_ort, t_engine, ratio = paired(functools.partial(session.run, None, ort_feeds),
                                        functools.partial(prepared, *values), args.runs)
        entry = {"nodes_forward": len(proto.graph.node), "nodes_lowered": len(lowered.graph.node),
                 "lowered_ort_s": t_ort, "engine_s": t_engine, "lowered_ort_over_engine": ratio,
                 "max_rel_diff_vs_engine": diff, "rel_l2_vs_engine": l2}
        if os.path.exists(args.ortt_python):
            paths = [os.path.join(tmp, f"{name}_{k}") for k in ("forward.onnx", "lowered.onnx", "feeds.npz")]
            onnx.save(upgraded(proto), paths[0])  # the same opset-17 graph the lowering starts from
            onnx.save(lowered, paths[1])
            np.savez(paths[2], **{k: np.asarray(v) for k, v in feeds.items()})
            run = subprocess.run([args.ortt_python, "-c", ORTT_SCRIPT, *paths, loss, ",".join(xs), str(args.runs),
                                  str(args.threads)],
                                 capture_output=True, text=True)
            lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
            error = (run.stderr.strip().splitlines() or ["?"])[-1]
            entry["ortt"] = json.loads(lines[-1]) if lines else {"error": error[max(0, error.find("The gradient")):]}
        results["models"][name] = entry
        print(name, json.dumps(entry), flush=True)
    write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
