"""`onnxgrad diff` against issue 34's end-to-end targets, on real files: one row per pair.

- optimized: a model against its onnxruntime-optimized file (graph optimizer EXTENDED / ALL, the
  transformers optimizer for bert / gpt2): the fused spans are matched, nothing diverges;
- 4-bit: a model against its MatMulNBits file: the culprits and the worst rows are the quantized MatMuls;
- int8: against onnxruntime's static QDQ and dynamic int8 files: what it names (no target, reported);
- onnxruntime: `diff MODEL --against onnxruntime` on the sample models, the timm / transformers
  exports and the tool exports (optimum, ultralytics, diffusers, genai): no divergence.

Models come from benchmarks/_real_models.py (exported on demand, cached), GPT-2 124M from
benchmarks/bench_scale.py's cache and the tool exports from build_tool_exports.py; a case whose
tool or file is absent is skipped with one line. Optimized and quantized files go to a temporary folder.

    python benchmarks/bench_diff_targets.py [--only bert,gpt2_124m] [--target optimized] [--json FILE]
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _diff_target_pairs as P  # noqa: E402
from _results import write_json  # noqa: E402

SMALL = ("bert", "gpt2", "llama", "vit_tiny", "resnet18", "efficientnet_b0")
# The transformers optimizer's model_type for each architecture it knows.
FUSER = {"bert": "bert", "gpt2": "gpt2", "vit_tiny": "vit", "llama": None}
TOOL_CASES = ("yolo11n", "unet_torchscript", "unet_dynamo", "llama_past_optimum", "gpt2_optimum", "t5_merged",
              "whisper_encoder", "whisper_merged", "genai_llama_fp32")
# Unmatched tensors that are expected of an optimizer's file: inside a fused span, folded constants.
BENIGN = ("inside a span", "a constant read only inside a span", "computed from constants and shapes",
          "read only by nodes computed from constants", "which hands its input on")


# B's unmatched tensors that are constants of its own (a transpose optimizer's perm, a folded shape), not values.
CONSTANT_B = ("initializer:", "computed from constants and shapes only")


def optimized_pairs(work: str):
    for name in SMALL:
        for exporter in ("torchscript", "dynamo"):
            tag = f"{name}/{exporter}"
            yield tag, lambda name=name, exporter=exporter: _optimized_small(work, name, exporter)
    yield "gpt2_124m/transformers", lambda: _optimized_gpt2(work)
    for tool in TOOL_CASES:
        yield f"{tool}/extended", lambda tool=tool: _optimized_tool(work, tool)


def _optimized_small(work, name, exporter):
    a = P.real_export(name, exporter, work)
    x = P.first_embedding(a)
    out = []
    for level in ("extended", "all"):
        b = P.ort_optimized(a, os.path.join(work, f"{name}_{exporter}_{level}.onnx"), level)
        out.append(P.Pair(f"{name}/{exporter}/ort-{level}", "optimized", a, b, y="y", xs=(x,)))
    if FUSER.get(name):
        b = P.transformers_optimized(a, os.path.join(work, f"{name}_{exporter}_tf.onnx"), FUSER[name], 4, 64)
        out.append(P.Pair(f"{name}/{exporter}/transformers-{FUSER[name]}", "optimized", a, b, y="y", xs=(x,)))
    return out


def _optimized_gpt2(work):
    if not os.path.exists(P.GPT2):
        raise P.Absent(f"{P.GPT2} is absent (python benchmarks/bench_scale.py exports it)")
    b = P.transformers_optimized(P.GPT2, os.path.join(work, "gpt2_124m_tf.onnx"), "gpt2", 12, 768)
    x = P.embedding_table(P.GPT2)
    return [P.Pair("gpt2_124m/transformers-gpt2", "optimized", P.GPT2, b, y="logits", xs=(x,),
                   zs=("input_ids", "attention_mask"))]


def _optimized_tool(work, tool):
    case = P.tool_case(tool)
    b = P.ort_optimized(case["path"], os.path.join(work, f"{tool}_extended.onnx"), "extended")
    return [P.Pair(f"{tool}/ort-extended", "optimized", case["path"], b, y=case["y"], xs=tuple(case["xs"]),
                   zs=tuple(case["zs"]), feeds=case["feeds"])]


def quantized_pairs(work: str):
    def small(name):
        a = P.real_export(name, "torchscript", work)
        x = P.first_embedding(a)
        feeds = P.made_up_feeds(a, "y", (x,), ())
        if name == "gpt2":  # Gemms: as for GPT-2 124M, quantize the transformers optimizer's MatMul + Add
            fused = P.transformers_optimized(a, os.path.join(work, "gpt2_tf_small.onnx"), "gpt2", 4, 64)
            b = P.nbits(fused, os.path.join(work, "gpt2_tf_small_q4.onnx"))
            return [P.Pair("gpt2/optimized+4-bit", "4-bit", fused, b, y="y", xs=(x,)),
                    P.Pair(f"{name}/int8-qdq", "int8", a, P.int8(a, os.path.join(work, f"{name}_qdq.onnx"), feeds, True),
                           y="y", xs=(x,))]
        return [P.Pair(f"{name}/4-bit", "4-bit", a, P.nbits(a, os.path.join(work, f"{name}_q4.onnx")), y="y", xs=(x,)),
                P.Pair(f"{name}/int8-qdq", "int8", a, P.int8(a, os.path.join(work, f"{name}_qdq.onnx"), feeds, True),
                       y="y", xs=(x,)),
                P.Pair(f"{name}/int8-dynamic", "int8", a, P.int8(a, os.path.join(work, f"{name}_dyn.onnx"), feeds,
                                                                 False), y="y", xs=(x,))]

    def gpt2():
        if not os.path.exists(P.GPT2):
            raise P.Absent(f"{P.GPT2} is absent (python benchmarks/bench_scale.py exports it)")
        b = P.nbits(P.GPT2, os.path.join(work, "gpt2_124m_q4.onnx"))
        x = P.embedding_table(P.GPT2)
        # The export's Conv1D layers are Gemms, which the quantizer leaves alone; the transformers
        # optimizer writes them as MatMul + Add first (optimize, then quantize: the usual order).
        fused = P.transformers_optimized(P.GPT2, os.path.join(work, "gpt2_124m_tf.onnx"), "gpt2", 12, 768)
        b2 = P.nbits(fused, os.path.join(work, "gpt2_124m_tf_q4.onnx"))
        zs = ("input_ids", "attention_mask")
        return [P.Pair("gpt2_124m/4-bit", "4-bit", P.GPT2, b, y="logits", xs=(x,), zs=zs),
                P.Pair("gpt2_124m/optimized+4-bit", "4-bit", fused, b2, y="logits", xs=(x,), zs=zs)]

    for name in ("bert", "gpt2", "llama"):
        yield f"{name}/quantized", lambda name=name: small(name)
    yield "gpt2_124m/4-bit", gpt2


def against_pairs(work: str):
    def samples():
        return [P.Pair(f"sample/{os.path.basename(p)[:-5]}", "onnxruntime", p, against="onnxruntime")
                for p in sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.onnx")))]

    def real(name, exporter):
        return [P.Pair(f"{name}/{exporter}/ort", "onnxruntime", P.real_export(name, exporter, work),
                       against="onnxruntime")]

    def tool(name):
        case = P.tool_case(name)
        return [P.Pair(f"{name}/ort", "onnxruntime", case["path"], against="onnxruntime", feeds=case["feeds"])]

    yield "samples", samples
    for name in SMALL:
        for exporter in ("torchscript", "dynamo"):
            yield f"{name}/{exporter}/ort", lambda name=name, exporter=exporter: real(name, exporter)
    for name in TOOL_CASES:
        yield f"{name}/ort", lambda name=name: tool(name)


def measure(pair: P.Pair) -> dict:
    import engine

    start = time.perf_counter()
    if pair.against:
        r = engine.diff(pair.a, against=pair.against, feeds=pair.feeds or None)
    else:
        r = engine.diff(pair.a, pair.b, y=pair.y, xs=pair.xs, zs=pair.zs, feeds=pair.feeds or None)
    seconds = time.perf_counter() - start
    spans = [n for n in r.nodes if n.where == "forward" and "stands for" in n.note]
    fused: dict[str, int] = {}
    for n in spans:
        fused[n.op_type] = fused.get(n.op_type, 0) + 1
    odd_a = [u for u in r.unmatched if u.side == "a" and not any(w in u.why for w in BENIGN)]
    odd_b = [u for u in r.unmatched if u.side == "b" and not u.why.startswith(CONSTANT_B)]
    worst = [n for n in r.worst() if n.diverges][:8]
    return {
        "case": pair.name, "target": pair.target, "ok": not r.diverges, "seconds": round(seconds, 2),
        "compared": len(r.nodes), "spans": len(spans), "fused": fused,
        "unmatched_a": len([u for u in r.unmatched if u.side == "a"]), "unexplained_a": len(odd_a),
        "unmatched_b": len(odd_b), "unmatched_b_constants": sum(u.side == "b" for u in r.unmatched) - len(odd_b),
        "unmatched_examples": [f"{u.side}:{u.tensor}: {u.why}" for u in (odd_a + odd_b)[:4]],
        "diverging": {w: sum(n.diverges for n in r.nodes if n.where == w) for w in ("forward", "gradient")},
        "culprits": [f"{c.node} ({c.op_type}, {c.where}, {c.error:.2g} > {c.tolerance:.2g})" for c in r.culprits[:12]],
        "culprit_ops": sorted({c.op_type for c in r.culprits}),
        "worst": [f"{n.node} ({n.op_type}, {n.where}, {n.local_error:.2g} / {n.tolerance:.2g})" for n in worst],
        "notes": [n for n in r.notes if "onnxruntime" in n][:3],
        "b_ops": P.op_counts(pair.b) if pair.b else {},
    }


def verdict(row: dict) -> str:
    """Whether the case meets its target, in a word."""
    if "onnxruntime cannot run A" in row.get("error", ""):
        return "n/a: onnxruntime cannot run the file"
    if "nchwc" in row.get("error", ""):
        return "n/a: B has onnxruntime's NCHWc layout ops (CPU-specific; the engine does not run them)"
    if "error" in row:
        return "ERROR"
    if row["target"] in ("optimized", "onnxruntime"):
        return "holds" if row["ok"] and not row["unmatched_b"] else "FAILS"
    if row["target"] == "4-bit":
        if not row["b_ops"].get("MatMulNBits"):
            return "n/a: nothing quantized"
        quantized = all("MatMulNBits" in c for c in row["culprit_ops"]) and row["culprit_ops"]
        worst = all("MatMulNBits" in w for w in row["worst"][:5])
        return "holds" if quantized and worst else "FAILS"
    return "reported"


def table(rows: list[dict]) -> str:
    head = ("| case | target | compared | spans (fused ops) | unmatched A (unexplained) / B (+constants) | diverging fwd / grad "
            "| culprits | s | verdict |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['target']} | | | | | {r['error'][:120]} | | {verdict(r)} |")
            continue
        fused = ", ".join(f"{k} {v}" for k, v in sorted(r["fused"].items()))
        culprits = "; ".join(r["culprits"][:2]) + (f" (+{len(r['culprits']) - 2})" if len(r["culprits"]) > 2 else "")
        lines.append(f"| {r['case']} | {r['target']} | {r['compared']} | {r['spans']} ({fused}) | "
                     f"{r['unmatched_a']} ({r['unexplained_a']}) / {r['unmatched_b']} (+{r['unmatched_b_constants']}) | "
                     f"{r['diverging']['forward']} / {r['diverging']['gradient']} | {culprits} | {r['seconds']} | "
                     f"{verdict(r)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--target", default="", help="optimized, quantized or onnxruntime")
    ap.add_argument("--keep", default="", help="a folder to write the built files to (kept); default a temporary one")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "diff_targets.json"))
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or scratch
        os.makedirs(work, exist_ok=True)
        groups = {"optimized": optimized_pairs, "quantized": quantized_pairs, "onnxruntime": against_pairs}
        for target, make in groups.items():
            if args.target and args.target != target:
                continue
            for tag, build in make(work):
                if only and not any(s in tag for s in only):
                    continue
                try:
                    pairs = build()
                except P.Absent as e:
                    print(f"skip {tag}: {e}")
                    continue
                except Exception as e:  # noqa: BLE001 - a tool failing on a real file is a result too
                    rows.append({"case": tag, "target": target, "error": f"building the pair: {type(e).__name__}: {e}"[:300]})
                    print(f"{tag}: ERROR building the pair: {rows[-1]['error']}", flush=True)
                    continue
                for pair in pairs:
                    try:
                        row = measure(pair)
                    except Exception as e:  # noqa: BLE001 - a crash is a result: reported, not hidden
                        row = {"case": pair.name, "target": pair.target, "error": f"{type(e).__name__}: {e}"[:300]}
                    print(f"{row['case']}: {verdict(row)} {row.get('seconds', '')}s", flush=True)
                    rows.append(row)
    write_json(args.json, {"rows": rows})
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
