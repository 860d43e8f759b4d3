"""The model pairs of issue 34's end-to-end targets, built from real files on demand (never committed):
onnxruntime's optimized files (its graph optimizer at EXTENDED / ALL, its transformers optimizer), its
4-bit MatMulNBits file and its int8 QDQ / dynamic files, next to the model they came from.

A pair is a `Pair`: A's path, B's path (or `against` onnxruntime), the selection and the feeds. Builders
raise `Absent` with a one-line reason where a tool or a cached file is missing: the case is skipped.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CACHE = os.path.expanduser("~/.cache/onnxgrad-bench")
GPT2 = os.path.join(CACHE, "scale", "gpt2-v1", "gpt2.onnx")
TOOLS = os.path.join(CACHE, "tools")


class Absent(Exception):
    """What the case needs is not here: skipped with this line."""


@dataclass
class Pair:
    name: str
    target: str  # "optimized", "4-bit", "int8", "onnxruntime"
    a: str
    b: str | None = None
    against: str | None = None
    y: str | None = None
    xs: tuple[str, ...] = ()
    zs: tuple[str, ...] = ()
    feeds: dict = field(default_factory=dict)
    b_ops: dict = field(default_factory=dict)  # B's op_type -> count (what the tool made of A)


def op_counts(path: str) -> dict[str, int]:
    import onnx

    out: dict[str, int] = {}
    for n in onnx.load(path, load_external_data=False).graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def real_export(name: str, exporter: str, work: str) -> str:
    """A timm / transformers model (small config, random weights) by one torch exporter, as a file."""
    try:
        from _real_models import CASES, available, build, export
    except Exception as e:  # noqa: BLE001 - the benchmark's helpers need torch only; a failure is a skip
        raise Absent(f"benchmarks/_real_models.py does not import: {e}") from e
    if not available():
        raise Absent("timm or transformers is not installed")
    case = {c.name: c for c in CASES}[name]
    module, x = build(case)
    path = os.path.join(work, f"{name}_{exporter}.onnx")
    with open(path, "wb") as fh:
        fh.write(export(module, x, exporter))
    return path


def ort_optimized(src: str, dst: str, level: str) -> str:
    """onnxruntime's graph optimizer at `level` ("extended" or "all"), its result written to `dst`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                     "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    opts.optimized_model_filepath = dst
    if any(os.path.exists(os.path.join(os.path.dirname(src), f)) for f in (os.path.basename(src) + ".data",
                                                                          os.path.basename(src) + "_data")):
        # A file with external data: the optimized one gets its own beside it (else it points at nothing)
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                      os.path.basename(dst) + ".data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return dst


def transformers_optimized(src: str, dst: str, model_type: str, heads: int = 0, hidden: int = 0) -> str:
    """onnxruntime.transformers.optimizer.optimize_model (graph optimizer off: its own fusions only)."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimize_model(src, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0).save_model_to_file(dst)
    return dst


def nbits(src: str, dst: str, block: int = 32) -> str:
    """onnxruntime's MatMulNBits 4-bit weight-only quantizer (symmetric, blocks of `block`)."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)  # a line per node otherwise

    q = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=block, is_symmetric=True)
    q.process()
    q.model.save_model_to_file(dst, use_external_data_format=False)
    return dst


class _Reader:
    """quantize_static's calibration: a few feeds of the model's own made-up values."""

    def __init__(self, feeds_list):
        self._it = iter(feeds_list)

    def get_next(self):
        return next(self._it, None)


def int8(src: str, dst: str, feeds: dict, static: bool) -> str:
    """onnxruntime's int8 quantization: static QDQ (calibrated on `feeds` and two perturbations of its
    float inputs) or dynamic (weights int8, activations quantized at run time)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    if not static:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        return dst
    rng = np.random.default_rng(0)
    batches = [feeds] + [{k: (v + 0.1 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
                          for k, v in feeds.items()} for _ in range(2)]
    quantize_static(src, dst, _Reader(batches), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=False)
    return dst


def made_up_feeds(path: str, y: str, xs, zs) -> dict:
    """The engine's own feeds for the model's inputs, as numpy (what diff would make up), so an int8
    calibration sees the same kind of values."""
    import engine
    from engine.dtypes import to_numpy
    from engine.modeldiff.sides import make_feeds

    model = engine.load(path)
    feeds, *_ = make_feeds(model, None, y=y, xs=list(xs), zs=list(zs))
    return {k: to_numpy(v) for k, v in feeds.items() if k in model.graph.inputs}


def first_embedding(path: str) -> str:
    """The first float value a model computes from its ids (an embedding Gather's output), or its first
    float graph input: the xs of a pair, a tensor every optimizer keeps."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    for i in model.graph.input:
        if i.name not in inits and i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            return i.name
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[0] in inits:
            return n.output[0]
    raise Absent(f"{path}: no float input and no embedding Gather to take the gradient with respect to")


def embedding_table(path: str) -> str:
    """The first embedding Gather's table (an initializer): the xs of GPT-2 124M's pairs, whose optimized
    file reads its ids through more nodes than the export."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[0] in inits:
            return n.input[0]
    raise Absent(f"{path}: no embedding Gather")


def tool_case(name: str) -> dict:
    folder = os.path.join(TOOLS, name)
    if not os.path.exists(os.path.join(folder, "case.json")):
        raise Absent(f"{folder} is absent (python benchmarks/build_tool_exports.py builds it)")
    from _tool_exports import load_case

    return load_case(folder)
