"""The contrib lowering sweep (engine/conformance/contrib_lowered.py): the cases of every com.microsoft op
with an ai.onnx expansion, lowered, run by onnxruntime and compared with the engine in float32 and float16.

The suite runs a fixed subset that covers every op and every attribute family (each attribute, optional
input, integer or string attribute value, output count and word of the case labels appears in at least
one chosen case). The full
sweep, every case (a few minutes):

    onnxgrad conformance --contrib --lower
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli import main as cli_main
from engine.conformance.contrib_cases import all_cases
from engine.conformance.contrib_lowered import (
    EPS,
    ULPS,
    contrib_lowering_sweep,
    expanded_ops,
    lower_contrib_case,
    ulps,
)
from engine.conformance.status import LOWERED, WRONG

pytest.importorskip("onnxruntime")


def _families(case) -> set[str]:
    given = {f"input:{n}" for n, v in case.inputs if v is not None}
    words = {f"label:{w}" for w in re.findall(r"[A-Za-z_]{2,}", case.label)}
    attrs = {f"attr:{a}" for a, _ in case.attrs} | {f"attr:{a}={v}" for a, v in case.attrs if isinstance(v, (int, str))}
    return given | words | attrs | {f"outputs:{len(case.outputs)}"}


def covering_subset(cases) -> list:
    """Per op, cases taken greedily (in the sweep's seeded order) until every family of that op is covered."""
    chosen = []
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(c.op, []).append(c)
    for group in by_op.values():
        missing = set().union(*(_families(c) for c in group))
        while missing:
            best = max(group, key=lambda c: len(_families(c) & missing))
            chosen.append(best)
            missing -= _families(best)
    return chosen


SUBSET = covering_subset([c for c in all_cases() if c.op in expanded_ops()])


def test_the_subset_covers_every_expanded_op():
    assert {c.op for c in SUBSET} == expanded_ops() == {c.op for c in all_cases()}
    gqa = {f for c in SUBSET if c.op == "GroupQueryAttention" for f in _families(c)}
    assert {"label:static", "label:packed", "label:padded", "input:past_key", "input:head_sink",
            "attr:local_window_size", "attr:rotary_interleaved", "attr:smooth_softmax", "attr:softcap"} <= gqa


def test_the_covering_subset_lowers_and_matches_the_engine_in_float32_and_float16():
    run = contrib_lowering_sweep(SUBSET)
    bad = [f"{o.status} {o.name}: {o.reason}" for o in run.outcomes if o.status != LOWERED]
    assert not bad, "\n".join(bad)
    half = sum(c.half for c in SUBSET)
    assert len(run.outcomes) == len(SUBSET) + half and half >= len(SUBSET) - 3
    assert all(o.lowerings >= 1 for o in run.outcomes)


def test_ulps_are_counted_at_the_values_scale():
    want = np.array([4.0, -2.0, 0.5], np.float32)
    assert ulps(want + np.array([0, 0, 3 * 4 * EPS["float16"]]), want, "float16") == pytest.approx(3.0)
    small = np.array([1e-3, 0.0])  # below 1, the scale is 1: unit-scale terms cancelled into it
    assert ulps(small + 2 * EPS["float32"], small, "float32") == pytest.approx(2.0)
    assert ulps(np.array([np.nan, 0.0]), small, "float32") == float("inf")
    assert ulps(want[:2], want, "float32") == float("inf")


@pytest.fixture
def half_split_rotary(monkeypatch):
    """RotaryEmbedding's expansion confusing its layouts: an interleaved rotary written as the half-split one."""
    from engine.lowering import contrib

    right = contrib.EXPANSIONS["RotaryEmbedding"]

    def swapped(ctx, node):
        from onnx import helper

        flipped = helper.make_node(node.op_type, node.input, node.output, name=node.name, domain=node.domain,
                                   **{**{a.name: helper.get_attribute_value(a) for a in node.attribute},
                                      "interleaved": 0})
        right(ctx, flipped)

    monkeypatch.setitem(contrib.EXPANSIONS, "RotaryEmbedding", swapped)
    return next(c for c in all_cases() if c.op == "RotaryEmbedding" and dict(c.attrs).get("interleaved"))


def test_a_wrong_expansion_is_reported_wrong(half_split_rotary):
    for dtype in ("float32", "float16"):
        outcome = lower_contrib_case(half_split_rotary, dtype)
        assert outcome.status == WRONG and outcome.ulps > 100 * ULPS[dtype], outcome


def test_cli_exits_1_on_a_wrong_case(half_split_rotary, capsys):
    code = cli_main(["conformance", "--contrib", "--lower", "--op", "RotaryEmbedding", "--case", half_split_rotary.label])
    out = capsys.readouterr().out
    assert code == 1 and f"wrong            {half_split_rotary.name}: output: " in out


def test_cli_runs_the_lowering_sweep_and_prints_per_op_counts(capsys):
    code = cli_main(["conformance", "--contrib", "--lower", "--op", "RotaryEmbedding", "--op", "GroupQueryAttention",
                     "--per-op", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "contrib lowered: 4 / 4 match the engine" in out
    assert re.search(r"GroupQueryAttention\s+float32 1/1  float16 1/1", out)


def test_cli_refuses_gradients_with_lower(capsys):
    assert cli_main(["conformance", "--contrib", "--lower", "--gradients", "--op", "Gelu"]) == 2
    assert "--gradients" in capsys.readouterr().err


@pytest.fixture(scope="module")
def genai_lowered():
    """A genai-shaped model (packed GroupQueryAttention with rotary, symbolic batch, sequence and past
    lengths, seqlens_k and the total length computed from the mask) lowered once w.r.t. the embeddings
    and the past cache: the sweep's cases have static shapes, this one keeps every length a run-time value."""
    import onnxruntime as ort

    import engine
    from engine.lowering import lower
    from tests.past_models import genai_llm

    proto = genai_llm()
    xs = ["h", "past_key_values.0.key", "past_key_values.0.value"]
    lowered = lower(proto, "logits", xs, ["attention_mask"], dy="dy")
    assert not any(n.domain == "com.microsoft" for n in lowered.graph.node)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    return engine.load(proto), session, xs


@settings(max_examples=12, deadline=None)
@given(batch=st.sampled_from([1, 2]), seq=st.integers(1, 3), past=st.integers(0, 4), short=st.integers(0, 2),
       seed=st.integers(0, 2**16))
def test_a_genai_shaped_model_lowers_with_run_time_lengths(genai_lowered, batch, seq, past, short, seed):
    """Prompts (an empty past, a right-padded row) and decode steps (a left-padded row's shorter past):
    onnxruntime on the lowered file gives the engine's logits, presents and gradients."""
    from tests.past_models import HEAD, KV_HEADS, VOCAB

    model, session, xs = genai_lowered
    if past and seq > 1:
        batch = 1  # the kernel's rule: a prompt over a past is one sequence
    total = past + seq
    short = min(short, past if past else seq - 1) if batch == 2 else 0  # row 1 holds that many fewer tokens
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, total), np.int64)
    mask[1:, total - short:] = 0  # only its sum counts: seqlens_k = sum - 1
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask,
             "past_key_values.0.key": rng.standard_normal((batch, KV_HEADS, past, HEAD)).astype(np.float32),
             "past_key_values.0.value": rng.standard_normal((batch, KV_HEADS, past, HEAD)).astype(np.float32)}
    want = model.run(feeds)
    dy = rng.standard_normal(want["logits"].shape).astype(np.float32)
    grads = model.gradient("logits", xs, ["attention_mask"], feeds, dy=dy).grads
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {**feeds, "dy": dy})))
    for name in ("logits", "present.0.key", "present.0.value"):
        assert ulps(got[name], want[name], "float32") <= ULPS["float32"], name
    for x in xs:
        assert ulps(got[f"dlogits_d{x}"], grads[x], "float32") <= ULPS["float32"], x
