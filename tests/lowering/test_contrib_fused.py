"""com.microsoft Attention, MultiHeadAttention, EmbedLayerNormalization and DynamicQuantizeMatMul lowered
through their ai.onnx expansions (engine/lowering/contrib_fused.py): every conformance case in float32 and
float16 against the engine (the contrib lowering sweep's own check), DynamicQuantizeMatMul against
onnxruntime's kernel and a numpy straight-through oracle, symbolic batch and sequence axes, refusals."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.conformance.contrib import node_model, onnxruntime_outputs
from engine.conformance.contrib_cases import all_cases
from engine.conformance.contrib_lowered import lower_contrib_case, ulps
from engine.conformance.status import LOWERED
from engine.errors import LoweringError
from engine.lowering import lower

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"
OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "DynamicQuantizeMatMul")
RUNS = [(c, d) for c in all_cases() if c.op in OPS for d in ("float32", "float16") if d == "float32" or c.half]


def _ort(proto, feeds):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


@pytest.mark.parametrize("case, dtype", RUNS, ids=[f"{c.name}@{d}" for c, d in RUNS])
def test_every_case_lowers_and_onnxruntime_matches_the_engine(case, dtype):
    outcome = lower_contrib_case(case, dtype)
    assert outcome.status == LOWERED, outcome.reason
    assert outcome.lowerings >= 1


def _dqmm(a, b, scale, zero=None, bias=None):
    inputs = [("A", a), ("B", b), ("b_scale", scale), ("b_zero_point", zero), ("bias", bias)]
    while inputs[-1][1] is None:
        inputs.pop()
    feeds = {n: v for n, v in inputs if v is not None}
    return inputs, feeds


def _dequantized(b, scale, zero):
    return (b.astype(np.float64) - (0 if zero is None else zero.astype(np.float64))) * scale.astype(np.float64)


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 4), inner=st.integers(1, 9), cols=st.integers(1, 5), shift=st.sampled_from([-2.0, 0.0, 0.7]),
       spread=st.sampled_from([0.0, 1e-3, 1.0, 40.0]), signed=st.booleans(), seed=st.integers(0, 2**16))
def test_dynamic_quantize_matmul_rounds_as_the_kernel_and_passes_dA_straight_through(rows, inner, cols, shift, spread,
                                                                                      signed, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((rows, inner)) * spread + shift).astype(np.float32)
    b = rng.integers(-63, 64, (inner, cols)).astype(np.int8) if signed else \
        rng.integers(0, 256, (inner, cols)).astype(np.uint8)
    scale = rng.uniform(0.01, 0.1, cols).astype(np.float32)
    zero = (rng.integers(-5, 6, cols) if signed else rng.integers(100, 156, cols)).astype(b.dtype)
    inputs, feeds = _dqmm(a, b, scale, zero, rng.standard_normal(cols).astype(np.float32))
    kernel = onnxruntime_outputs(node_model("DynamicQuantizeMatMul", MS, inputs, {}, ["Y"], 17, feeds), feeds)[0]
    proto = node_model("DynamicQuantizeMatMul", MS, inputs, {}, ["Y"], 17, feeds, [kernel])
    dy = rng.standard_normal(kernel.shape).astype(np.float32)
    lowered = lower(proto, "Y", ["A", "b_scale", "bias"], ["B", "b_zero_point"], dy="dy", names=["dA", "dscale", "dbias"])
    got = _ort(lowered, {**feeds, "dy": dy})
    # A's uint8 rounding as the kernel's: one wrong step would be off by a whole quantization step
    assert ulps(got["Y"], kernel, "float32") <= 16
    oracle = dy.astype(np.float64) @ _dequantized(b, scale, zero).T  # dY · dequant(B)ᵀ, straight through
    assert ulps(got["dA"], oracle, "float32") <= 16
    want = engine.load(proto).gradient("Y", ["A", "b_scale", "bias"], ["B", "b_zero_point"], feeds, dy=dy).grads
    assert ulps(got["dscale"], want["b_scale"], "float32") <= 64
    assert ulps(got["dbias"], dy.sum(0), "float32") <= 16


def test_dynamic_quantize_matmul_in_float16_matches_the_engine():
    """onnxruntime's kernel is float32 only (so the sweep has no float16 case): the lowered file runs anyway."""
    for case in [c for c in all_cases() if c.op == "DynamicQuantizeMatMul"][:6]:
        feeds = {n: v.astype(np.float16) if v.dtype == np.float32 else v for n, v in case.feeds().items()}
        untyped = node_model(case.op, MS, case.inputs, {}, ["Y"], 17, feeds, [np.zeros(1, np.float16)])
        y = engine.load(untyped, check=False).run(feeds)["Y"]
        proto = node_model(case.op, MS, case.inputs, {}, ["Y"], 17, feeds, [y])
        xs = [x for x in case.xs if x in feeds]
        zs = [n for n in feeds if n not in xs]
        dy = np.random.default_rng(0).standard_normal(y.shape).astype(np.float16)
        got = _ort(lower(proto, "Y", xs, zs, dy="dy", names=[f"d{x}" for x in xs]), {**feeds, "dy": dy})
        want = engine.load(proto).gradient("Y", xs, zs, feeds, dy=dy).grads
        assert ulps(got["Y"], y, "float16") <= 2, case.name
        for x in xs:
            assert ulps(got[f"d{x}"], want[x], "float16") <= 16, (case.name, x)


def _symbolic(op, inputs, attrs, outputs):
    """A one-node model whose batch and sequence axes are symbolic; inputs and outputs: (name, elem, shape), an
    omitted input as ("", None, None)."""
    node = helper.make_node(op, [n for n, _, _ in inputs], [n for n, _, _ in outputs], domain=MS, **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(*i) for i in inputs if i[0]],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def _lowered_once_runs_at_two_sizes(proto, y, xs, make_feeds):
    zs = [i.name for i in proto.graph.input if i.name not in xs]
    lowered = lower(proto, y, xs, zs, dy="dy", names=[f"d{x}" for x in xs])
    model = engine.load(proto)
    for batch, seq in ((1, 3), (2, 5)):
        feeds = make_feeds(np.random.default_rng(batch), batch, seq)
        y_value = model.run(feeds)[y]
        dy = np.random.default_rng(seq).standard_normal(y_value.shape).astype(np.float32)
        got = _ort(lowered, {**feeds, "dy": dy})
        want = model.gradient(y, xs, zs, feeds, dy=dy).grads
        assert ulps(got[y], y_value, "float32") <= 64
        for x in xs:
            assert ulps(got[f"d{x}"], want[x], "float32") <= 64, (batch, seq, x)


@pytest.mark.parametrize("mask_shape", [["b", "s"], ["b"], ["m"]], ids=["raw", "lengths", "length_or_ends_starts"])
def test_attention_with_symbolic_batch_and_sequence_lowers_once(mask_shape):
    """As onnxruntime's BERT optimizer writes it: the mask_index of (B) lengths (EmbedLayerNormalization's
    output) on a symbolic batch; a mask whose length is its own symbol is (B) or (2B), read at run time."""
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    proto = _symbolic("Attention", [("input", f, ["b", "s", 8]), ("weights", f, [8, 24]), ("bias", f, [24]),
                                    ("mask_index", i32, mask_shape)],
                      {"num_heads": 2, "unidirectional": 1}, [("output", f, ["b", "s", 8]), ("present", f, [2, "b", 2, "s", 4])])

    def feeds(rng, batch, seq):
        if len(mask_shape) == 2:
            mask = rng.integers(0, 2, (batch, seq)).astype(np.int32)
            mask[:, 0] = 1
        else:  # ends, and with a symbolic length at the second size also starts
            mask = rng.integers(2, seq + 1, batch if mask_shape == ["b"] or batch == 1 else 2 * batch).astype(np.int32)
            mask[batch:] = rng.integers(0, 2, mask.size - batch)
        return {"input": rng.standard_normal((batch, seq, 8)).astype(np.float32),
                "weights": rng.standard_normal((8, 24)).astype(np.float32), "bias": rng.standard_normal(24).astype(np.float32),
                "mask_index": mask}

    _lowered_once_runs_at_two_sizes(proto, "output", ["input", "weights", "bias"], feeds)


def test_multi_head_attention_and_embed_layer_norm_with_symbolic_axes_lower_once():
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    omitted = [("", None, None)] * 3  # bias, key_padding_mask, attention_bias
    mha = _symbolic("MultiHeadAttention", [(n, f, ["b", "s", 8]) for n in ("query", "key", "value")] + omitted +
                    [("past_key", f, ["b", 2, 2, 4]), ("past_value", f, ["b", 2, 2, 4])], {"num_heads": 2, "unidirectional": 1},
                    [("output", f, ["b", "s", 8]), ("present_key", f, ["b", 2, "t", 4]), ("present_value", f, ["b", 2, "t", 4])])

    def mha_feeds(rng, batch, seq):
        out = {n: rng.standard_normal((batch, seq, 8)).astype(np.float32) for n in ("query", "key", "value")}
        return out | {n: rng.standard_normal((batch, 2, 2, 4)).astype(np.float32) for n in ("past_key", "past_value")}

    _lowered_once_runs_at_two_sizes(mha, "output", ["query", "key", "value", "past_key", "past_value"], mha_feeds)
    eln = _symbolic("EmbedLayerNormalization", [("input_ids", i32, ["b", "s"]), ("segment_ids", i32, ["b", "s"]),
                                                ("word_embedding", f, [11, 6]), ("position_embedding", f, [8, 6]),
                                                ("segment_embedding", f, [2, 6]), ("gamma", f, [6]), ("beta", f, [6]),
                                                ("mask", i32, ["b", "s"])],
                    {}, [("output", f, ["b", "s", 6]), ("mask_index", i32, ["b"])])

    def eln_feeds(rng, batch, seq):
        return {"input_ids": rng.integers(0, 11, (batch, seq)).astype(np.int32),
                "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32),
                "word_embedding": rng.standard_normal((11, 6)).astype(np.float32),
                "position_embedding": rng.standard_normal((8, 6)).astype(np.float32),
                "segment_embedding": rng.standard_normal((2, 6)).astype(np.float32),
                "gamma": rng.standard_normal(6).astype(np.float32), "beta": rng.standard_normal(6).astype(np.float32),
                "mask": rng.integers(0, 3, (batch, seq)).astype(np.int32)}

    _lowered_once_runs_at_two_sizes(eln, "output", ["word_embedding", "position_embedding", "segment_embedding", "gamma",
                                                    "beta"], eln_feeds)
    feeds = eln_feeds(np.random.default_rng(3), 2, 4)
    got = _ort(lower(eln, "output", ["gamma"], [n for n in feeds if n != "gamma"]), feeds)
    np.testing.assert_array_equal(got["mask_index"], (feeds["mask"] == 1).sum(-1))  # the kernel counts the 1s


@pytest.mark.parametrize("attrs, inputs, match", [
    ({"do_rotary": 1}, [("mask_index", TensorProto.INT32, [2, 3])], "do_rotary has no expansion"),
    ({}, [("mask_index", TensorProto.INT32, [8])], "3·batch"),
    ({}, [("mask_index", TensorProto.INT32, [2, 1, 3, 3])], "4-D mask"),
])
def test_attention_forms_without_an_expansion_are_refused_in_one_line(attrs, inputs, match):
    f = TensorProto.FLOAT
    batch = "b" if match == "do_rotary has no expansion" else 2
    proto = _symbolic("Attention", [("input", f, [batch, 3, 8]), ("weights", f, [8, 24]), ("", None, None)] + inputs,
                      {"num_heads": 2, **attrs}, [("output", f, [batch, 3, 8])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(LoweringError, match=match) as info:
            lower(proto, "output", ["input"], [i.name for i in proto.graph.input if i.name != "input"])
    assert "\n" not in str(info.value) and "Attention" in str(info.value)
