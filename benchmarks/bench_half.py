"""The bench_real models in float16 and bfloat16, in their own dtype, against references we did
not write.

Each model (small config, perturbed random weights) is cast with `.half()` / `.to(bfloat16)` before
export, by both torch exporters. float16: the forward against onnxruntime on the same file. bfloat16
(onnxruntime has no bfloat16 CPU kernels for these ops): against onnxruntime on the file widened to
float32 (`retyped`: the same weights, already rounded to bfloat16). Then every intermediate's dtype
against ONNX's inferred type, and the gradient in the model's own dtype as `onnxgrad check` judges
it (verify/native.py: against float64 through the values rounded to the dtype).

    python benchmarks/bench_half.py [--models gpt2,resnet18] [--dtypes float16,bfloat16] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _real_models as real_models  # noqa: E402
from _results import write_json  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Forward tolerance against the reference, in units of the dtype's epsilon of the output's scale:
# both sides round every value (onnxruntime in float16 as well), the models are a dozen layers deep.
FORWARD_ULPS = 16


@dataclass(frozen=True)
class HalfResult:
    model: str
    exporter: str
    dtype: str
    status: str  # "ok", or why the row has no numbers (the exporter's error)
    forward_err: float = float("nan")  # max |engine - reference| / max |reference|, in the dtype's eps
    type_mismatches: int = -1
    native: str = ""  # each x's native_status (pass: within the dtype's precision)
    native_err: float = float("nan")  # worst max |native gradient - float64 gradient| over the xs
    rounding_err: float = float("nan")  # what rounding the values alone moves the float64 gradient
    seconds: float = 0.0


def exported(case, dtype: str, exporter: str):
    """(module, input, ONNX bytes) in `dtype`, or (module, input, error text) when export fails."""
    module, x = real_models.build(case)
    module = module.to(DTYPES[dtype])
    if x.is_floating_point():
        x = x.to(DTYPES[dtype])
    try:
        return module, x, real_models.export(module, x, exporter)
    except Exception as exc:  # an exporter that cannot export this dtype: reported, not fatal
        return module, x, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"


def reference_output(data: bytes, dtype: str, feed: np.ndarray) -> np.ndarray:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    from engine.conformance.retype import retyped

    if dtype == "bfloat16":
        data = retyped(onnx.load_from_string(data), TensorProto.BFLOAT16, TensorProto.FLOAT, casts=True).SerializeToString()
        feed = feed.astype(np.float32) if feed.dtype.kind == "V" or feed.dtype.name == "bfloat16" else feed
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: feed})[0]


def numpy_input(x: torch.Tensor) -> np.ndarray:
    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.float().numpy().astype(ml_dtypes.bfloat16)
    return x.numpy()


def gradient_selection(model, module, x_name: str, float_input: bool) -> tuple[list[str], list[str]]:
    """The input if float, then three weights matched to parameters (first, middle, last)."""
    matched = sorted(real_models.match_weights(model, module))
    weights = [matched[0], matched[len(matched) // 2], matched[-1]] if len(matched) >= 3 else matched
    return ([x_name] if float_input else []) + weights, [] if float_input else [x_name]


def run_one(case, dtype: str, exporter: str) -> HalfResult:
    import onnx

    import engine
    from engine.conformance.typecheck import dtype_mismatches
    from engine.verify import check

    start = time.perf_counter()
    module, x, data = exported(case, dtype, exporter)
    if isinstance(data, str):
        return HalfResult(case.name, exporter, dtype, f"export fails: {data}")
    proto = onnx.load_from_string(data)
    model = engine.load(proto)
    x_name = model.inputs[0]
    feed = numpy_input(x)
    try:
        got = model.run({x_name: feed})[model.outputs[0]].astype(np.float64)
    except engine.OnnxGradError as e:
        # The dynamo exporter writes resnet18.to(bfloat16) with float32 weights next to a bfloat16
        # input: a mistyped file that onnxruntime and onnx's checker refuse too.
        return HalfResult(case.name, exporter, dtype, f"refused: {e}")
    want = reference_output(data, dtype, feed).astype(np.float64)
    eps = torch.finfo(DTYPES[dtype]).eps
    forward_err = float(np.abs(got - want).max() / np.abs(want).max() / eps)
    mismatches = dtype_mismatches(model, proto, {x_name: feed})
    xs, zs = gradient_selection(model, module, x_name, x.is_floating_point())
    report = check(model, model.outputs[0], xs, zs, {x_name: feed}, mode="fast")
    return HalfResult(case.name, exporter, dtype, "ok", forward_err, len(mismatches),
                      ",".join(str(r.native_status) for r in report.results),
                      max(r.native_max_abs_err or 0.0 for r in report.results),
                      max(r.native_rounding_err or 0.0 for r in report.results), time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(c.name for c in real_models.CASES))
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--exporters", default=",".join(real_models.EXPORTERS))
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "half.json"))
    args = parser.parse_args(argv)
    if not real_models.available():
        sys.exit("bench_half needs timm and transformers (not project dependencies)")
    cases = {c.name: c for c in real_models.CASES}
    rows = []
    print(f"{'model':16} {'exporter':12} {'dtype':9} {'fwd err/eps':>11} {'types':>5} {'native':>16} "
          f"{'vs f64':>9} {'rounding':>9} {'s':>6}")
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for exporter in args.exporters.split(","):
                r = run_one(cases[name], dtype, exporter)
                rows.append(r)
                if r.status != "ok":
                    print(f"{name:16} {exporter:12} {dtype:9} {r.status}", flush=True)
                    continue
                print(f"{name:16} {exporter:12} {dtype:9} {r.forward_err:11.2f} {r.type_mismatches:5d} "
                      f"{r.native:>16} {r.native_err:9.3g} {r.rounding_err:9.3g} {r.seconds:6.1f}", flush=True)
    if args.json:
        meta = {"torch": torch.__version__, "load": os.getloadavg()[0], "forward_ulps": FORWARD_ULPS}
        write_json(args.json, {"meta": meta, "rows": [asdict(r) for r in rows]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
