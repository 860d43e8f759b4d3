"""engine.lower on real architectures (timm, transformers; small configs, random weights) exported by both
torch exporters with a symbolic batch (and sequence) axis: lowered, checked, run by onnxruntime at two
input sizes against the engine (benchmarks/_real_lowering.py; the full survey of 12 architectures is
`python benchmarks/bench_lower.py --real` and docs/lowering.md). Skipped where timm or transformers do
not import."""
import os
import sys

import pytest

from tests import paths

sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
import _real_models as real_models  # noqa: E402

pytest.importorskip("onnxruntime")


@pytest.mark.slow
@pytest.mark.parametrize("name, exporter", [
    ("mobilenetv3", "torchscript"),  # HardSwish, HardSigmoid, depthwise Conv
    ("convnext_atto", "dynamo"),  # Gelu (opset 20 from dynamo), LayerNormalization, depthwise Conv
    ("bert", "dynamo"),  # attention, Gelu, LayerNormalization, embeddings (Gather), int64 input ids
])
def test_real_model_lowers_and_matches(name, exporter):
    if not real_models.available():
        pytest.skip("timm or transformers does not import")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    from _real_lowering import lower_real

    case = next(c for c in real_models.LOWERING_CASES if c.name == name)
    result = lower_real(case, exporter, dynamic=True)
    assert result.passed, result.problem
    assert result.xs >= 10 and result.worst_l2 <= 1e-4 or result.kink_flips
