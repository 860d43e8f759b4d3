"""onnxruntime's com.microsoft contrib ops: a seeded one-case-per-op sample of the sweep (forward against
onnxruntime in float32 and float16, gradient against float64 finite differences), the floor the full
sweep (`onnxgrad conformance --contrib --gradients`, minutes) recorded in docs/ops.md, the one-line
refusals, the loader's handling of onnxruntime's default-domain ops and independent numpy oracles.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.cli import main as cli_main
from engine.conformance.contrib import ContribCase, case_model, node_model
from engine.conformance.contrib_cases import all_cases
from engine.conformance.contrib_cases_quant import pack_bits
from engine.conformance.contrib_report import BEGIN, END
from engine.errors import OnnxGradError, UnsupportedOpError
from engine.modelfile.contrib_schema import SIGNATURES
from engine.registry import supported_ops
from tests import paths

ROOT = paths.ROOT
ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"


@pytest.fixture(scope="module")
def sample():
    from engine.conformance.contrib import contrib_sweep

    firsts = {}
    for case in all_cases():
        firsts.setdefault(case.op, case)
    return contrib_sweep(list(firsts.values()), gradients=True)


def test_every_op_of_the_family_is_registered_and_swept():
    registered = {i.op_type for i in supported_ops() if i.domain == MS}
    swept = {c.op for c in all_cases()}
    assert registered == swept - {"SimplifiedLayerNormalization", "LayerNormalization"}
    assert len(registered) == 20
    per_op = {op: sum(c.op == op for c in all_cases()) for op in swept}
    assert min(per_op.values()) >= 20, per_op
    assert len({c.name for c in all_cases()}) == len(all_cases()), "case names must be unique"


def test_one_case_per_op_matches_onnxruntime_and_finite_differences(sample):
    bad = [f"{o.name}: {o.status} {o.message}" for o in sample.outcomes if o.status != "pass"]
    assert not bad, "\n".join(bad)
    assert len(sample.outcomes) == 2 * 22 - 1  # DynamicQuantizeMatMul takes float32 only
    grads = [f"{g.name}: {g.status} {g.reason}" for g in sample.gradients if g.status != "pass"]
    assert not grads and len(sample.gradients) == 22, "\n".join(grads)


def test_docs_table_holds_the_full_sweep():
    """The section `python scripts/gen_ops_doc.py --contrib` wrote: every op, none failing, at least 20 cases."""
    text = (ROOT / "docs" / "ops.md").read_text()
    assert BEGIN in text and END in text
    rows = [line.split("|")[1:-1] for line in text.split(BEGIN)[1].split(END)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| op ")]
    table = {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}
    assert set(table) == {c.op for c in all_cases()}
    for op, (_, f32, f16, gradient, *_) in table.items():
        passed, total = (int(v) for v in f32.split(" / "))
        assert passed == total >= 20, (op, f32)
        if f16 != "–":
            assert f16 == f32, (op, f16)
        assert gradient in ("pass", "inconclusive"), (op, gradient)


def test_signatures_are_onnxruntimes():
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    schemas = {(s.domain, s.name, s.since_version): s for s in get_all_operator_schema()}
    for (domain, op), (inputs, outputs) in SIGNATURES.items():
        schema = schemas.get((domain, op, 1))
        assert schema is not None, (domain, op)
        assert tuple(i.name for i in schema.inputs) == inputs, op
        assert tuple(o.name for o in schema.outputs) == outputs, op


def _node(op, values: dict, outputs=("Y",), **attrs):
    return ContribCase(op, "t", tuple(values.items()), tuple(sorted(attrs.items())), outputs)


def _run(case):
    return engine.load(case_model(case, "float32", None), check=False).run(case.feeds())


R = np.random.default_rng(0)


@pytest.mark.parametrize("case, message", [
    (_node("Attention", {"input": R.standard_normal((1, 2, 4), np.float32),
                         "weights": R.standard_normal((4, 12), np.float32)}, ("output",), num_heads=2, do_rotary=1),
     "do_rotary is not supported"),
    (_node("Attention", {"input": R.standard_normal((1, 2, 4), np.float32),
                         "weights": R.standard_normal((4, 12), np.float32), "bias": None,
                         "mask_index": np.ones((1, 1, 2, 2), np.int32)}, ("output",), num_heads=2),
     "4-D (Megatron) mask is not supported"),
    (_node("MatMulNBits", {"A": np.ones((1, 16), np.float32), "B": np.zeros((2, 1, 8), np.uint8),
                           "scales": np.ones(2, np.float32)}, K=16, N=2, block_size=16, weight_prepacked=1),
     "weight_prepacked=1"),
    (_node("MatMulNBits", {"A": np.ones((1, 16), np.float32), "B": np.zeros((2, 1, 16), np.uint8),
                           "scales": np.ones(2, np.float32), "zero_points": None,
                           "g_idx": np.zeros(16, np.int32)}, K=16, N=2, block_size=16, bits=8),
     "g_idx with 8-bit weights is not supported"),
    (_node("GatherBlockQuantized", {"data": np.zeros((4, 16), np.int8), "indices": np.array([0]),
                                    "scales": np.ones((4, 1), np.float32)}, ("output",), block_size=16),
     "data of type torch.int8 is not supported"),
    (_node("FusedConv", {"X": np.ones((1, 1, 3, 3), np.float32), "W": np.ones((1, 1, 1, 1), np.float32)},
           activation="Gelu"), "activation 'Gelu' is not supported"),
])
def test_refusals_are_one_line_and_name_what_is_missing(case, message):
    with pytest.raises(OnnxGradError, match=re.escape(message)) as info:
        _run(case)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, UnsupportedOpError)


def test_a_refused_attribute_is_a_one_line_cli_error(tmp_path, capsys):
    case = _node("GroupQueryAttention", {
        "query": np.ones((1, 1, 8), np.float32), "key": np.ones((1, 1, 8), np.float32),
        "value": np.ones((1, 1, 8), np.float32), "past_key": None, "past_value": None,
        "seqlens_k": np.zeros(1, np.int32), "total_sequence_length": np.array(1, np.int32)},
        ("output",), num_heads=1, kv_num_heads=1, k_quant_type="PER_TENSOR")
    path = tmp_path / "gqa.onnx"
    path.write_bytes(node_model(case.op, MS, case.inputs, dict(case.attrs), case.outputs, 17, case.feeds(),
                                [np.ones((1, 1, 8), np.float32)]).SerializeToString())
    code = cli_main(["run", str(path)])
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if not line.startswith("note: ")]  # the made-up inputs are noted first
    assert code == 2 and len(errors) == 1 and "quantized KV cache" in errors[0]
    assert lines[-1] == errors[0]


def test_loader_checks_onnxruntimes_default_domain_ops():
    """SimplifiedLayerNormalization (any opset) and LayerNormalization below 17 exist only in onnxruntime."""
    x, w = np.ones((2, 4), np.float32), np.full(4, 2.0, np.float32)
    for op, opset in (("SimplifiedLayerNormalization", 17), ("LayerNormalization", 14)):
        proto = node_model(op, "", (("X", x), ("scale", w)), {}, ("Y",), opset, {"X": x, "scale": w}, [x])
        y = engine.load(proto).run({"X": x, "scale": w})["Y"]
        np.testing.assert_allclose(y, (np.zeros_like(x) if op == "LayerNormalization" else w * x), atol=1e-3)
        assert proto.graph.node[0].domain == "" and len(proto.opset_import) == 2  # restored after the check
    bad = node_model("SimplifiedLayerNormalization", "", (("X", x),), {}, ("Y",), 17, {"X": x}, [x])
    bad.graph.node[0].input.append("missing")
    with pytest.raises(OnnxGradError, match="checker"):
        engine.load(bad)


@settings(max_examples=15, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), n=st.integers(1, 4), blocks=st.integers(1, 3), block=st.sampled_from([16, 32]),
       k_cut=st.integers(0, 15), rows=st.integers(1, 3), zero=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_nbits_is_the_product_with_the_dequantized_weights(bits, n, blocks, block, k_cut, rows, zero, seed):
    """numpy's A · ((q − zero) · scale)ᵀ, with q, zero unpacked by hand: the layout the quantizer writes."""
    rng = np.random.default_rng(seed)
    k = max(1, blocks * block - k_cut)
    q = rng.integers(0, 1 << bits, (n, blocks * block))
    scales = rng.uniform(-0.2, 0.2, (n, blocks)).astype(np.float32)
    zeros = rng.integers(0, 1 << bits, (n, blocks)) if zero else np.full((n, blocks), 1 << (bits - 1))
    a = rng.standard_normal((rows, k)).astype(np.float32)
    weight = ((q - np.repeat(zeros, block, 1)) * np.repeat(scales, block, 1))[:, :k]
    values = {"A": a, "B": pack_bits(q, bits).reshape(n, blocks, -1), "scales": scales,
              "zero_points": pack_bits(zeros, bits) if zero else None}
    y = _run(_node("MatMulNBits", values, K=k, N=n, bits=bits, block_size=block))["Y"]
    np.testing.assert_allclose(y, a.astype(np.float64) @ weight.T, rtol=1e-5, atol=1e-5)


def test_contrib_cli_runs_a_sample_and_writes_json(tmp_path, capsys):
    out = tmp_path / "contrib.json"
    code = cli_main(["conformance", "--contrib", "--op", "QuickGelu", "--max-cases", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "contrib forward: 4 / 4 pass" in text and "QuickGelu" in text
    data = json.loads(out.read_text())
    assert data["forward"] == {"pass": 4} and data["cases"] == 2


def test_contrib_cli_refuses_an_unknown_op(capsys):
    assert cli_main(["conformance", "--contrib", "--op", "SkipLayerNorm"]) == 2
    assert "did you mean SkipLayerNormalization" in capsys.readouterr().err


LOWERED = ("Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd", "BiasSplitGelu", "GemmFastGelu", "FusedMatMul",
           "FusedConv", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
           "LayerNormalization", "MatMulIntegerToFloat", "Attention", "MultiHeadAttention", "EmbedLayerNormalization",
           "DynamicQuantizeMatMul")


def _lowered_gradients_match(proto, y, xs, zs, feeds):
    from engine.lowering import lower

    lowered = lower(proto, y=y, xs=",".join(xs), zs=",".join(zs) if zs else None)
    assert not any(n.domain == MS for n in lowered.graph.node)  # it runs on any runtime
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    want = engine.load(proto).gradient(y, xs, zs, feeds).grads
    for x in xs:
        np.testing.assert_allclose(got[f"d{y}_d{x}"], want[x], rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want[x]).max()))


@pytest.mark.parametrize("op", LOWERED)
def test_lowering_expands_contrib_ops_into_ai_onnx(op):
    from engine.conformance.contrib import expected

    case = next(c for c in all_cases() if c.op == op)
    feeds = case.feeds()
    xs = [x for x in case.xs if x in feeds]
    _lowered_gradients_match(case_model(case, "float32", expected(case, "float32")), case.outputs[0], xs,
                             [n for n in feeds if n not in xs], feeds)


def test_lowering_expands_quantized_weights_held_as_initializers(tmp_path):
    from onnx import load

    from tests.explorer.test_explorer_contrib import _contrib_model

    proto = load(_contrib_model(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((1, 3, 16)).astype(np.float32)
    _lowered_gradients_match(proto, "y", ["x", "gamma", "fc_bias", "scales"], [], {"x": x})


def _quantized_kv_gqa():
    """A GroupQueryAttention whose KV cache is quantized (k_quant_type): the engine refuses it, lowering too."""
    x = np.ones((1, 1, 8), np.float32)
    case = _node("GroupQueryAttention", {
        "query": x, "key": x, "value": x, "past_key": None, "past_value": None,
        "seqlens_k": np.zeros(1, np.int32), "total_sequence_length": np.array(1, np.int32)},
        ("output",), num_heads=1, kv_num_heads=1, k_quant_type="PER_TENSOR")
    return node_model(case.op, MS, case.inputs, dict(case.attrs), case.outputs, 17, case.feeds(), [x])


def test_lowering_refuses_an_attribute_combination_without_an_expansion_in_one_line():
    from engine.lowering import lower

    with pytest.raises(OnnxGradError, match=r"node .*\(GroupQueryAttention\): a quantized KV cache .* has no "
                                            r"expansion") as info:
        lower(_quantized_kv_gqa(), y="output", xs="query", zs="key,value,seqlens_k,total_sequence_length")
    assert "\n" not in str(info.value)


def test_lowering_refuses_a_contrib_op_without_an_expansion_in_one_line(monkeypatch):
    """Every contrib op the engine runs has one today; an op left without one names those that have one."""
    from engine.conformance.contrib import expected
    from engine.lowering import contrib, lower

    monkeypatch.delitem(contrib.EXPANSIONS, "QuickGelu")
    case = next(c for c in all_cases() if c.op == "QuickGelu")
    proto = case_model(case, "float32", expected(case, "float32"))
    with pytest.raises(OnnxGradError, match=r"com.microsoft::QuickGelu has no ai.onnx expansion \(those with one: "
                                            r"Attention, .*GroupQueryAttention") as info:
        lower(proto, y="output", xs="X")
    assert "\n" not in str(info.value)
