"""Real architectures cast to float16 / bfloat16 before export (transformers' GPT-2 and BERT, timm's
resnet18; small configs, random weights), by both torch exporters, run and differentiated in their
own dtype: the forward against onnxruntime (bfloat16: on the same file widened to float32), every
intermediate in the dtype ONNX's types give it, the gradient within the dtype's precision as
`onnxgrad check` judges it (benchmarks/bench_half.py runs all seven models).

timm and transformers are optional: skipped where they do not import.
"""
import os
import sys

import pytest

from tests import paths

sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
import _real_models as real_models  # noqa: E402
import bench_half  # noqa: E402

CASES = {c.name: c for c in real_models.CASES}


def _needs(exporter):
    real_models.stub_torchvision()
    pytest.importorskip("timm")
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")


@pytest.mark.parametrize("exporter", real_models.EXPORTERS)
@pytest.mark.parametrize("name, dtype", [("gpt2", "float16"), ("bert", "float16"), ("resnet18", "float16"),
                                         ("gpt2", "bfloat16"), ("resnet18", "bfloat16")])
def test_half_model_runs_and_differentiates_in_its_own_dtype(name, dtype, exporter):
    _needs(exporter)
    result = bench_half.run_one(CASES[name], dtype, exporter)
    if (name, dtype, exporter) == ("resnet18", "bfloat16", "dynamo"):
        _assert_refused_like_onnxruntime(result)
        return
    assert result.status == "ok", result.status
    assert result.forward_err <= bench_half.FORWARD_ULPS, result
    assert result.type_mismatches == 0, result
    assert set(result.native.split(",")) == {"pass"}, result


def _assert_refused_like_onnxruntime(result):
    """torch 2.13's dynamo exporter writes resnet18.to(bfloat16) with float32 Conv weights next to a
    bfloat16 input: the engine must refuse it in one line, as onnxruntime refuses the same file."""
    import onnxruntime as ort

    _, x, data = bench_half.exported(CASES["resnet18"], "bfloat16", "dynamo")
    assert result.status.startswith("refused: ") and "the model is mistyped" in result.status, result.status
    assert "\n" not in result.status
    with pytest.raises(Exception, match="bfloat16"):
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
