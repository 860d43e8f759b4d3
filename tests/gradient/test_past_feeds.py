"""Made-up feeds for an LLM with past key values, and the dim expressions exporters write
(`past_sequence_length + sequence_length`): onnxruntime runs the same made-up feeds and agrees."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.errors import FeedError
from engine.gradient.dims import check_dims, describe_dims, dims_from_feeds, sized, symbolic_dims
from engine.gradient.feeds import check_feed, complete_feeds
from engine.gradient.past_feeds import past_layout, with_past
from engine.modelfile.dim_expr import evaluate, names_in, solve
from tests.past_models import HEAD, KV_HEADS, PAST_OPTIMUM, VOCAB, genai_llm, merged_decoder, optimum_llm

NAMES = ("a", "b", "seq_len", "s0")


# --- dim expressions ---------------------------------------------------------------------------------
def _render(tree, dims, draw) -> tuple[str, int]:
    """(text, value) of a tree, spaced at random; Python's own integers are the oracle."""
    if isinstance(tree, tuple):
        op, left, right = tree
        (lt, lv), (rt, rv) = _render(left, dims, draw), _render(right, dims, draw)
        if op == "//" and rv == 0:
            op = "+"
        value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "//": lv // rv if rv else 0}[op]
        space = draw(st.sampled_from(["", " "]))
        return f"({lt}{space}{op}{space}{rt})", value
    return (tree, dims[tree]) if isinstance(tree, str) else (str(tree), tree)


leaves = st.one_of(st.sampled_from(NAMES), st.integers(0, 40))
trees = st.recursive(leaves, lambda inner: st.tuples(st.sampled_from(["+", "-", "*", "//"]), inner, inner),
                     max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_dim_expression_evaluates_as_python_does(data):
    tree = data.draw(trees)
    dims = {n: data.draw(st.integers(0, 40)) for n in NAMES}
    text, value = _render(tree, dims, data.draw)
    if data.draw(st.booleans()) and text.startswith("("):
        text = text[1:-1]  # exporters write the outer sum bare
    assert evaluate(text, dims) == value
    used = [n for n in names_in(text) if n in NAMES]
    assert set(names_in(text)) <= set(NAMES) | {text}
    if used:  # a name left unset leaves the expression unsized
        assert evaluate(text, {k: v for k, v in dims.items() if k != used[0]}) is None


@settings(max_examples=100, deadline=None)
@given(scale=st.integers(1, 4), offset=st.integers(-3, 8), other=st.integers(0, 9), x=st.integers(0, 30),
       spaced=st.booleans())
def test_solve_recovers_the_one_missing_name(scale, offset, other, x, spaced):
    sp = " " if spaced else ""
    text = f"{scale}*past{sp}+{sp}seq{sp}+{sp}({offset})"
    size = scale * x + other + offset
    assert solve(text, size, {"seq": other}) == ("past", x)
    assert solve(text, size, {}) is None  # two names missing: no single answer


@pytest.mark.parametrize("text,value", [
    ("past_sequence_length + sequence_length", 6), ("past_sequence_length+sequence_length", 6), ("2*s0", 14),
    ("(s0 // 2)", 3), ("floor(s0/2)", 3), ("ceiling(s0/2)", 4), ("Max(1, s0 - 9)", 1), ("s0 - 1", 6), ("s0/2", None),
    ("unknown + 1", None), ("batch size", None),
])
def test_exporters_dim_texts(text, value):
    assert evaluate(text, {"past_sequence_length": 4, "sequence_length": 2, "s0": 7}) == value


# --- sizing and checking with expressions -----------------------------------------------------------
OPTIMUM = engine.load(optimum_llm())
GENAI = engine.load(genai_llm())


def test_expressions_size_check_and_describe():
    g, dims = OPTIMUM.graph, {"past_sequence_length": 3, "sequence_length": 5}
    assert sized(g.types["attention_mask"].shape, dims) == (1, 8)
    assert {"past_sequence_length", "sequence_length"} <= set(symbolic_dims(g))
    assert check_dims(g, dims) == dims  # the names inside the expression are dims of the model
    assert check_dims(g, {PAST_OPTIMUM: 9}) == {PAST_OPTIMUM: 9}  # the expression itself, as before
    check_feed(g, "attention_mask", np.ones((1, 8), np.int64), dims)
    with pytest.raises(FeedError, match=r"past_sequence_length \+ sequence_length is 8, not 7"):
        check_feed(g, "attention_mask", np.ones((1, 7), np.int64), dims)
    assert "past_sequence_length=3, sequence_length=5, past_sequence_length + sequence_length=8" in \
        describe_dims(g, ["attention_mask"], dims)
    # a mask of 6 beside 2 current tokens: the past is 4
    seen = dims_from_feeds(g, {"input_ids": np.zeros((1, 2)), "attention_mask": np.ones((1, 6))})
    assert seen["past_sequence_length"] == 4


# --- coherent made-up feeds --------------------------------------------------------------------------
def _ort(proto, feeds, outputs):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(outputs, {k: np.asarray(v) for k, v in feeds.items()})))


def _agrees(model, proto, feeds):
    mine = model.run(feeds)
    theirs = _ort(proto, feeds, model.outputs)
    for name in model.outputs:
        np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-4, atol=1e-5, err_msg=name)
        assert np.any(theirs[name]), f"{name} is all zeros"
    return mine


@pytest.mark.parametrize("past", [None, 0, 3])
def test_optimum_llm_made_up_feeds_run_in_onnxruntime(past):
    dims = with_past(OPTIMUM.graph, {}, past)
    feeds, chosen = complete_feeds(OPTIMUM, {}, targets=OPTIMUM.outputs, dims=dims)
    want = 4 if past is None else past
    assert feeds["past_key_values.0.key"].shape == (1, 2, want, 4)
    assert feeds["attention_mask"].shape == (1, want + 2) and feeds["attention_mask"].all()
    assert feeds["position_ids"].tolist() == [[want, want + 1]]
    assert 0 <= feeds["input_ids"].min() and feeds["input_ids"].max() < VOCAB
    out = _agrees(OPTIMUM, optimum_llm(), feeds)
    assert out["present.0.key"].shape == (1, 2, want + 2, 4)
    notes = {d.name: d.note for d in chosen}
    assert f"using {want}..{want + 1}" in notes["position_ids"]


def test_a_mask_over_past_plus_one_fixes_one_current_position():
    proto = optimum_llm("past_sequence_length + 1")
    model = engine.load(proto)
    feeds, _ = complete_feeds(model, {}, targets=model.outputs)
    assert feeds["input_ids"].shape == (1, 1) and feeds["attention_mask"].shape == (1, 5)
    assert feeds["position_ids"].tolist() == [[4]]
    _agrees(model, proto, feeds)


def test_fed_values_set_the_past():
    key = np.zeros((2, 2, 3, 4), np.float32)
    feeds, _ = complete_feeds(OPTIMUM, {"past_key_values.0.key": key}, targets=["logits"])
    assert feeds["attention_mask"].shape == (2, 5) and feeds["position_ids"].tolist() == [[3, 4]] * 2
    feeds, _ = complete_feeds(OPTIMUM, {"attention_mask": np.ones((1, 9), np.int64)}, targets=["logits"])
    assert feeds["past_key_values.0.value"].shape == (1, 2, 7, 4) and feeds["position_ids"].tolist() == [[7, 8]]
    _agrees(OPTIMUM, optimum_llm(), feeds)


@pytest.mark.parametrize("rotary", [True, False])
def test_group_query_attention_gets_its_head_size_from_the_model(rotary):
    model = GENAI if rotary else engine.load(genai_llm(rotary))
    layout = past_layout(model.graph)
    assert layout.heads["kv_cache_dim"][0] == HEAD and "GroupQueryAttention 'gqa'" in layout.heads["kv_cache_dim"][1]
    feeds, _ = complete_feeds(model, {}, targets=model.outputs, dims=with_past(model.graph, {}, 5))
    assert feeds["past_key_values.0.key"].shape == (1, KV_HEADS, 5, HEAD)
    assert feeds["attention_mask"].shape == (1, 7)
    _agrees(model, genai_llm(rotary), feeds)


def test_genai_length_inputs_follow_the_past():
    proto = genai_llm(length_inputs=True)
    model = engine.load(proto)
    feeds, chosen = complete_feeds(model, {}, targets=model.outputs, dims=with_past(model.graph, {}, 3))
    assert feeds["seqlens_k"].tolist() == [4] and feeds["total_sequence_length"].item() == 5
    assert feeds["seqlens_k"].dtype == np.int32 and feeds["past_key_values.0.key"].shape == (1, KV_HEADS, 3, HEAD)
    _agrees(model, proto, feeds)


def test_merged_decoder_takes_the_with_past_branch():
    proto = merged_decoder()
    model = engine.load(proto)
    feeds, chosen = complete_feeds(model, {}, targets=model.outputs)
    assert feeds["use_cache_branch"].tolist() == [True]
    assert feeds["past_key_values.0.decoder.key"].shape == (1, 2, 4, 4)
    assert feeds["past_key_values.0.encoder.key"].shape == (1, 2, 3, 4) == feeds["past_key_values.0.encoder.value"].shape
    assert feeds["encoder_hidden_states"].shape == (1, 3, 8) and feeds["input_ids"].shape == (1, 2)
    assert "encoder's positions" in {d.name: d.note for d in chosen}["past_key_values.0.encoder.key"]
    _agrees(model, proto, feeds)
    first, _ = complete_feeds(model, {}, targets=model.outputs, dims=with_past(model.graph, {}, 0))
    assert first["use_cache_branch"].tolist() == [False] and first["past_key_values.0.decoder.key"].shape[2] == 0


def test_past_needs_a_model_with_past_and_a_whole_number():
    with pytest.raises(FeedError, match="no past key values"):
        with_past(engine.load("sample_models/mlp.onnx").graph, {}, 2)
    with pytest.raises(FeedError, match="0 or more"):
        with_past(OPTIMUM.graph, {}, -1)
    with pytest.raises(FeedError, match="contradicts --dim past_sequence_length=2"):
        with_past(OPTIMUM.graph, {"past_sequence_length": 2}, 3)


def test_gradient_and_selection_values_take_past():
    spec = OPTIMUM.selection("logits", ["past_key_values.0.key"], "inputs")
    values = OPTIMUM.selection_values(spec, {}, past=3)
    assert values["past_key_values.0.key"].shape == (1, 2, 3, 4) and values["attention_mask"].shape == (1, 5)
    result = OPTIMUM.gradient("logits", ["past_key_values.0.key"], "inputs", past=3)
    assert result.grads["past_key_values.0.key"].shape == (1, 2, 3, 4)
    assert np.any(result.grads["past_key_values.0.key"])  # the past is attended to, so it matters
