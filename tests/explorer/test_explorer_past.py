"""The explorer's made-up values for an LLM with past agree with each other as the CLI's do:
onnxruntime runs them and the engine gives the same outputs."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import engine
from explorer.state import Session
from tests.past_models import genai_llm, optimum_llm


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
