"""`onnxgrad run` on an LLM with past and no feeds: coherent made-up values that onnxruntime runs
alike, `--past N`, and a failed step that names the made-up input behind it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.cli import main
from tests.feed_models import matmul_model
from tests.past_models import genai_llm, optimum_llm


@pytest.fixture(scope="module")
def llms(tmp_path_factory):
    d = tmp_path_factory.mktemp("llms")
    for name, proto in (("optimum", optimum_llm()), ("genai", genai_llm()), ("mlp", matmul_model("batch"))):
        onnx.save(proto, str(d / f"{name}.onnx"))
    return d


def _feeds_from_notes(err: str) -> dict[str, str]:
    return {line.split()[1]: line for line in err.splitlines() if line.startswith("note: ") and " not fed" in line}


@pytest.mark.parametrize("name,past", [("optimum", None), ("optimum", 0), ("genai", 3)])
def test_run_with_no_feeds_matches_onnxruntime_on_the_same_values(llms, tmp_path, capsys, name, past):
    out = tmp_path / "out.npz"
    argv = ["run", str(llms / f"{name}.onnx"), "--out", str(out)] + (["--past", str(past)] if past is not None else [])
    assert main(argv) == 0
    err = capsys.readouterr().err
    want = 4 if past is None else past
    assert f"past of {want} position" in err and "--past N" in err
    made_up = _feeds_from_notes(err)
    assert "attention_mask" in made_up and "past_key_values.0.key" in made_up
    # the same made-up values, through the same options: what `run` fed
    from engine import load
    from engine.gradient.feeds import complete_feeds
    from engine.gradient.past_feeds import with_past

    model = load(str(llms / f"{name}.onnx"))
    values, _ = complete_feeds(model, {}, targets=model.outputs, dims=with_past(model.graph, {}, past))
    assert values["attention_mask"].shape[1] == want + 2
    ours = np.load(out)
    session = ort.InferenceSession(str(llms / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    theirs = dict(zip(model.outputs, session.run(model.outputs, values)))
    for k in model.outputs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-4, atol=1e-5, err_msg=k)
        assert np.any(ours[k])


def test_dims_for_the_names_inside_an_expression(llms, capsys):
    assert main(["run", str(llms / "optimum.onnx"), "--output", "logits",
                 "--dim", "sequence_length=3,past_sequence_length=5"]) == 0
    out, err = capsys.readouterr()
    assert "shape (1, 3, 11)" in out and "past_sequence_length + sequence_length=8" in err


def test_a_failed_step_names_the_made_up_input_and_keeps_the_notes(llms, capsys):
    # the position table has 16 rows: a past of 20 puts the made-up positions past its end
    assert main(["run", str(llms / "optimum.onnx"), "--output", "logits", "--past", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("onnxgrad: error: node 'positions' (Gather)")
    assert err[-1].endswith("(position_ids was made up: feed it, or set its dims with --dim or --past)")
    assert any(line.startswith("note: position_ids not fed: using 20..21") for line in err[:-1])


def test_past_on_a_model_without_past_is_one_line(llms, capsys):
    assert main(["run", str(llms / "mlp.onnx"), "--past", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--past: this model has no past key values" in err
