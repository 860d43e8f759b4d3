"""The explorer's made-up values for an LLM with past agree with each other as the CLI's do:
onnxruntime runs them and the engine gives the same outputs."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import engine
from explorer.state import Session
from tests.past_models import genai_llm, merged_decoder, optimum_llm


@pytest.mark.parametrize("build,past", [(optimum_llm, None), (genai_llm, None), (genai_llm, 0)])
def test_explorer_made_up_values_run_in_onnxruntime(build, past):
    proto = build()
    session = Session(engine.load(proto), "test")
    if past is not None:
        session.set_dims({"past_sequence_length": past})
    feeds = session.feed_values()
    want = 4 if past is None else past
    assert feeds["past_key_values.0.key"].shape[2] == want and feeds["attention_mask"].shape == (1, want + 2)
    assert f"past_sequence_length={want}" in session.dims_text()
    mine = session.model.run(feeds)
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        session.model.outputs, feeds)
    for name, value in zip(session.model.outputs, theirs):
        np.testing.assert_allclose(mine[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
        assert np.any(value), name


@pytest.mark.parametrize("build", [optimum_llm, lambda: genai_llm(length_inputs=True), merged_decoder])
def test_explorer_makes_up_the_same_values_as_the_cli(build):
    """Positions after the past, the lengths, use_cache_branch and token ids: one past plan for both."""
    from engine.gradient.feeds import complete_feeds

    proto = build()
    session = Session(engine.load(proto), "test")
    mine = session.feed_values()
    cli, _ = complete_feeds(session.model, {}, targets=session.model.outputs)
    assert set(mine) == set(cli)
    for name, value in cli.items():
        np.testing.assert_array_equal(mine[name], np.asarray(value), err_msg=name)
    positions = [n for n in mine if "position" in n]
    for name in positions:
        assert mine[name].min() == 4, name  # after the past of 4, not zeros
