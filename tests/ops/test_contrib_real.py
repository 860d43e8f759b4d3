"""Real files made by onnxruntime's own tools from bench_real's small timm/transformers models: the
transformer optimizer (SkipLayerNormalization, FastGelu, BiasGelu, Gelu, Attention, QuickGelu, FusedConv),
the 4/8-bit MatMulNBitsQuantizer and quantize_dynamic + onnxruntime's graph optimizer (DynamicQuantizeMatMul,
MatMulIntegerToFloat, FusedMatMul).

Forward against onnxruntime on the same file; the optimizer only fuses, so an optimized model's float64
gradient must equal the unoptimized model's (the fused ops' constants are exact where the exported graph
holds float32 roundings of sqrt(2/π) or √2, hence a 1e-6 relative tolerance, not 1e-12). Quantized files
are checked against float64 finite differences. timm, transformers and onnxruntime are optional: skipped
where they do not import (CI has neither of the first two).
"""
from __future__ import annotations

import collections
import copy
import functools
import os
import sys
import tempfile
import warnings

import numpy as np
import pytest

from tests import paths

sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
import _real_models as real_models  # noqa: E402

import engine  # noqa: E402

pytestmark = pytest.mark.slow
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
if not real_models.available():
    pytest.skip("timm and transformers are not installed", allow_module_level=True)

MODEL_TYPES = {"bert": "bert", "gpt2": "gpt2", "vit_tiny": "vit", "llama": "gpt2", "resnet18": "bert"}


def _saved(model_or_writer):
    """What onnxruntime's tools write to disk, read back (they add the com.microsoft opset on save)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        if hasattr(model_or_writer, "save_model_to_file"):
            model_or_writer.save_model_to_file(path)
        else:
            onnx.save(model_or_writer, path)
        return onnx.load(path)


@functools.lru_cache(maxsize=None)
def _exported(name, exporter):
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    case = next(c for c in real_models.CASES if c.name == name)
    module, x = real_models.build(case)
    return onnx.load_from_string(real_models.export(module, x, exporter)), x.numpy()


@functools.lru_cache(maxsize=None)
def _optimized(name, exporter, level):
    from onnxruntime.transformers.optimizer import optimize_model

    model, x = _exported(name, exporter)
    heads, hidden = (3, 192) if name == "vit_tiny" else (4, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        writer = optimize_model(copy.deepcopy(model), model_type=MODEL_TYPES[name], num_heads=heads,
                                hidden_size=hidden, opt_level=level)
    return model, _saved(writer), x


def _contrib_ops(model):
    return collections.Counter(n.op_type for n in model.graph.node
                               if n.domain == "com.microsoft" or n.op_type == "SimplifiedLayerNormalization")


def _onnxruntime(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_forward_matches(model, feeds):
    want = _onnxruntime(model, feeds)[0]
    got = engine.load(model).run(feeds)[model.graph.output[0].name]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _shared_initializers(a, b, limit):
    """Float initializers both files hold under the same name with the same values (the fusion kept them)."""
    from onnx import numpy_helper

    left = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    right = {i.name: numpy_helper.to_array(i) for i in b.graph.initializer}
    names = [n for n, v in left.items() if n in right and v.dtype == np.float32 and v.size > 1
             and v.shape == right[n].shape and np.array_equal(v, right[n])]
    return names[:: max(1, len(names) // limit)][:limit]


# efficientnet_b0 at level 2 (49 QuickGelu, 16 FusedConv) passes too, in about 2 minutes: resnet18 and llama
# cover its ops here.
OPTIMIZED = [(n, e, 0) for n in ("gpt2", "bert", "llama") for e in real_models.EXPORTERS] + \
    [("vit_tiny", "torchscript", 0), ("resnet18", "torchscript", 2), ("llama", "torchscript", 2)]
EXPECTED_OPS = {"gpt2": {"SkipLayerNormalization", "FastGelu"}, "bert": {"SkipLayerNormalization", "BiasGelu"},
                "vit_tiny": {"SkipLayerNormalization", "BiasGelu"}, "llama": {"SkipSimplifiedLayerNormalization"},
                "resnet18": {"FusedConv"}}


@pytest.mark.parametrize("name, exporter, level", OPTIMIZED)
def test_optimized_model_runs_like_onnxruntime_and_keeps_its_gradient(name, exporter, level):
    model, optimized, x = _optimized(name, exporter, level)
    ops = _contrib_ops(optimized)
    expected = EXPECTED_OPS[name] | ({"QuickGelu"} if (name, level) == ("llama", 2) else set())
    assert expected <= set(ops), f"the optimizer wrote {dict(ops)}"
    (x_name,) = [i.name for i in model.graph.input]
    feeds = {x_name: x}
    _assert_forward_matches(optimized, feeds)
    xs = _shared_initializers(model, optimized, 8) + ([x_name] if x.dtype == np.float32 else [])
    zs = [] if x_name in xs else [x_name]
    plain, fused = engine.load(model), engine.load(optimized)
    y = model.graph.output[0].name
    dy = np.random.default_rng(0).standard_normal(plain.run(feeds)[y].shape)
    want = plain.gradient(y, xs, zs, feeds, dy=dy, dtype="float64").grads
    got = fused.gradient(optimized.graph.output[0].name, xs, zs, feeds, dy=dy, dtype="float64").grads
    scale = max(float(np.abs(g).max()) for g in want.values())
    for n in xs:  # a key bias has gradient 0 (softmax ignores a shift): held to the overall scale
        atol = 1e-6 * max(float(np.abs(want[n]).max()), 1e-3 * scale)
        np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=atol, err_msg=n)


@functools.lru_cache(maxsize=None)
def _quantized(name, exporter, bits, block_size, symmetric):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model, x = _exported(name, exporter)
    quantizer = MatMulNBitsQuantizer(copy.deepcopy(model), bits=bits, block_size=block_size, is_symmetric=symmetric)
    quantizer.process()
    return _saved(quantizer.model.model), x


@pytest.mark.parametrize("name, exporter, bits, block_size, symmetric", [
    ("llama", "dynamo", 4, 32, False), ("llama", "torchscript", 8, 16, False), ("bert", "dynamo", 4, 32, True),
    ("bert", "torchscript", 4, 16, False)])
def test_nbits_quantized_model_runs_like_onnxruntime_and_passes_finite_differences(name, exporter, bits, block_size,
                                                                                     symmetric):
    quantized, x = _quantized(name, exporter, bits, block_size, symmetric)
    assert _contrib_ops(quantized)["MatMulNBits"] >= 12
    (x_name,) = [i.name for i in quantized.graph.input]
    feeds = {x_name: x}
    _assert_forward_matches(quantized, feeds)
    model = engine.load(quantized)
    float_weights = [i.name for i in quantized.graph.initializer if i.data_type == onnx.TensorProto.FLOAT
                     and len(i.dims) == 1 and i.dims[0] > 1][:4]
    scales = [n.input[2] for n in quantized.graph.node if n.op_type == "MatMulNBits"][:1]
    report = engine.verify.check(model, quantized.graph.output[0].name, float_weights + scales, [x_name], feeds,
                                 mode="sample", samples=6, seed=1)
    bad = [(r.name, r.status, r.reason) for r in report.results if r.status == "fail"]
    assert not bad, bad


def test_dynamic_quantized_bert_runs_like_onnxruntime():
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, x = _exported("bert", "torchscript")
    with tempfile.TemporaryDirectory() as tmp:
        src, quantized, fused = (os.path.join(tmp, f) for f in ("m.onnx", "q.onnx", "o.onnx"))
        onnx.save(model, src)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(src, quantized, weight_type=QuantType.QUInt8)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = fused
        options.log_severity_level = 3
        ort.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(fused)
    ops = _contrib_ops(optimized)
    assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat", "FusedMatMul"} <= set(ops), dict(ops)
    feeds = {optimized.graph.input[0].name: x}
    _assert_forward_matches(optimized, feeds)
    ln = [i.name for i in optimized.graph.initializer if "LayerNorm.weight" in i.name][:2]
    grads = engine.load(optimized).gradient(optimized.graph.output[0].name, ln, [optimized.graph.input[0].name],
                                            feeds).grads
    assert all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in grads.values())
    # lowered (DynamicQuantizeMatMul's A straight through, as the engine's), run by onnxruntime
    from engine.lowering import lower

    y = optimized.graph.output[0].name
    lowered = lower(optimized, y=y, xs=",".join(ln), zs=optimized.graph.input[0].name)
    got = dict(zip([o.name for o in lowered.graph.output], _onnxruntime(lowered, feeds)))
    for n in ln:
        np.testing.assert_allclose(got[f"d{y}_d{n}"], grads[n], rtol=1e-3, atol=1e-4 * max(1.0, np.abs(grads[n]).max()))


@pytest.mark.parametrize("source", ["llama-optimized", "llama-4bit", "bert-optimized"])
def test_lowered_contrib_model_runs_its_gradient_in_onnxruntime(source):
    """The contrib ops expand into ai.onnx ops: the lowered file's gradients, run by onnxruntime, are the engine's
    (BERT's through its fused Attention and SkipLayerNormalization)."""
    from engine.lowering import lower

    name, kind = source.split("-")
    model, x = (_optimized(name, "torchscript", 0)[1:] if kind == "optimized"
                else _quantized(name, "torchscript", 4, 32, False))
    (x_name,) = [i.name for i in model.graph.input]
    y = model.graph.output[0].name
    floats = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 1]
    xs = floats[:3] + [n.input[2] for n in model.graph.node if n.op_type == "MatMulNBits"][:1]
    lowered = lower(model, y=y, xs=",".join(xs), zs=x_name)
    got = dict(zip([o.name for o in lowered.graph.output], _onnxruntime(lowered, {x_name: x})))
    want = engine.load(model).gradient(y, xs, [x_name], {x_name: x}).grads
    for n in xs:
        np.testing.assert_allclose(got[f"d{y}_d{n}"], want[n], rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want[n]).max()))
