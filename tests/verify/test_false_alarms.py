"""No false alarms: every correct sample model passes in float32 and in float64, in full and fast mode."""
import os

import numpy as np
import onnx
import pytest

import engine
from tests.verify_models import SAMPLES, deep_chain, small_cnn, to_float64

X = np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)
# model, y, xs, zs, feeds, claimed, expected verdict (from sample_models/README.md)
CASES = [
    ("spec_conv_gemm", "Y", "W,Z", "X", {"X": X}, ["W=dY_dW", "Z=dY_dZ"], "pass"),
    ("spec_grad_wrt_h", "Y", "H,Z", "", None, None, "pass"),
    ("spec_second_order", "O", "X,W", "L", None, None, "pass"),
    ("spec_optional_output", "Y", "W,Z", "X", {"X": X}, ["Z=dY_dZ"], "pass"),
    ("mlp", "loss", "W1,b1,W2,b2", "X,T", None, None, "pass"),
    ("small_cnn", "logits", "X,conv1_W,bn_scale,bn_B,fc_W", "", None, None, "pass"),
    ("transformer_block", "loss", "X,Wq,Wk,Wv,Wo,ln1_scale,W1,W2", "", None, None, "pass"),
    ("lstm_step", "loss", "X,W,R,B,initial_h,initial_c", "", None, None, "pass"),
    ("residual_fanout", "loss", "X,W", "", None, None, "pass"),
    ("handwritten_backward", "y", "W,X", "", None, ["W=dW", "X=dX"], "pass"),
    ("kinks", "loss", "X,Y", "", None, None, "inconclusive"),
]


@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sample_models_raise_no_false_alarm(case, double):
    name, y, xs, zs, feeds, claimed, expected = case
    path = os.path.join(SAMPLES, f"{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{name}.onnx not built")
    proto = onnx.load(path)
    proto = to_float64(proto) if double else proto
    model = engine.load(proto)
    if feeds and double:
        feeds = {k: v.astype(np.float64) for k, v in feeds.items()}
    for mode in ("full", "fast"):
        report = engine.check(model, y, xs, zs, feeds=feeds, mode=mode, claimed=claimed,
                              order=2 if name == "spec_second_order" else 1)
        assert report.verdict == expected, report.summary()
        assert not any(r.status == "fail" for r in report.results + report.second_order)


@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
def test_benchmark_models_pass(double):
    for proto, xs in ((deep_chain(), ["x", "w0", "w11"]), (small_cnn(batch=2), ["x", "w1", "fc"])):
        proto = to_float64(proto) if double else proto
        report = engine.check(proto, "y", xs)
        assert report.verdict == "pass", report.summary()
