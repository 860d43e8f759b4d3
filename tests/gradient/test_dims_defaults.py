"""Realistic default feeds for exported models (issue 20): symbolic dims set in one place, random
integers over the indexed table, ones for masks, `--zs inputs`; the CLI says what it chose."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.cli import main
from engine.errors import FeedError
from engine.gradient.dims import check_dims, dims_from_feeds, parse_dims, symbolic_dims
from engine.gradient.feeds import default_spec, index_bound, parse_spec
from tests.debug_models import VOCAB, hidden_nan_attention, token_embeddings


@pytest.fixture(scope="module")
def lm():
    return engine.load(token_embeddings())


@pytest.fixture
def lm_path(tmp_path):
    path = tmp_path / "lm.onnx"
    onnx.save(token_embeddings(), path)
    return str(path)


def test_dims_parse_and_are_checked_against_the_model(lm):
    assert parse_dims("seq=32, batch=2") == {"seq": 32, "batch": 2}
    assert symbolic_dims(lm.graph) == {"batch": [("input_ids", 0), ("attention_mask", 0)],
                                       "seq": [("input_ids", 1), ("attention_mask", 1)]}
    for bad in ("seq", "seq=0", "seq=x", "=3"):
        with pytest.raises(FeedError, match="write NAME=N with N a positive integer"):
            parse_dims(bad)
    with pytest.raises(FeedError, match=r"'sq' is not a symbolic dim of this model \(its inputs' dims: 'batch', "
                                        r"'seq'; did you mean 'seq'\?\)"):
        check_dims(lm.graph, {"sq": 3})


def test_dims_size_every_made_up_value_and_feeds_fill_the_rest(lm):
    g = lm.graph
    assert parse_spec(g, "attention_mask", "ones").shape == (1, 1)
    assert parse_spec(g, "attention_mask", "ones", dims={"seq": 16}).shape == (1, 16)
    ids = np.zeros((2, 9), np.int64)
    assert dims_from_feeds(g, {"input_ids": ids}, {"seq": 4}) == {"seq": 4, "batch": 2}
    values, chosen = engine.gradient.feeds.defaults_for(lm, ["attention_mask"], {"input_ids": ids})
    assert values["attention_mask"].shape == (2, 9) and values["attention_mask"].dtype == np.int64


def test_integer_defaults_ones_for_masks_zeros_otherwise(lm):
    assert default_spec(lm.graph, "attention_mask") == "ones"
    assert default_spec(lm.graph, "input_ids") == "zeros"
    _, chosen = engine.gradient.feeds.defaults_for(lm, ["input_ids", "attention_mask"], {})
    assert [d.note for d in chosen] == [
        "input_ids not fed: using zeros (the integer default; random draws indices over [0, 7))",
        "attention_mask not fed: using ones (an integer input named like a mask)"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), seq=st.integers(1, 6), batch=st.integers(1, 3))
def test_random_integers_index_the_table_they_feed(seed, seq, batch):
    graph = _LM.graph
    ids = parse_spec(graph, "input_ids", f"random:{seed}", dims={"seq": seq, "batch": batch})
    assert ids.shape == (batch, seq) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < VOCAB
    mask = parse_spec(graph, "attention_mask", f"random:{seed}", dims={"seq": seq, "batch": batch})
    assert set(np.unique(mask)) <= {0, 1}  # indexes no table: [0, 2)


_LM = engine.load(token_embeddings())


def test_random_ids_cover_the_table_and_bound_follows_reshapes(lm):
    ids = parse_spec(lm.graph, "input_ids", "random:0", dims={"seq": 200})
    assert set(np.unique(ids)) == set(range(VOCAB))
    assert index_bound(lm.graph, "input_ids") == VOCAB
    attention = engine.load(hidden_nan_attention())
    assert index_bound(attention.graph, "mask") is None  # a Cast to bool, then Where: no table


def test_api_gradient_takes_dims(lm):
    result = lm.gradient("y", ["x"], ["input_ids", "attention_mask"], dims={"seq": 5, "batch": 2})
    assert result.grads["x"].shape == (2, 5, 4) and result.y.shape == (2, 5, 3)
    assert result.values["attention_mask"].tolist() == [[1] * 5] * 2
    with pytest.raises(FeedError, match="'tokens' is not a symbolic dim"):
        lm.gradient("y", ["x"], ["input_ids", "attention_mask"], dims={"tokens": 5})


def test_cli_dim_zs_inputs_and_the_notes(lm_path, capsys):
    code = main(["grad", lm_path, "--y", "y", "--xs", "x", "--zs", "inputs", "--dim", "seq=5,batch=2",
                 "--feed", "input_ids=random:3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "dy/dx: shape (2, 5, 4) float32" in out
    assert err.splitlines() == [
        "note: 'x' is determined by 'input_ids', allowed as an extension: 'input_ids' reaches y around it only "
        "through non-differentiable paths ('input_ids' → Shape 'shape')",
        "note: attention_mask not fed: using ones (an integer input named like a mask)",
        "note: x not fed: using its forward value",
        "note: symbolic dims of the made-up values: batch=2, seq=5 (--dim NAME=N sets one; unset dims are 1)"]


def test_cli_dims_come_from_a_fed_file_and_must_agree_with_dim(lm_path, tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3, 4, 5, 6]], np.int64))
    args = ["grad", lm_path, "--y", "y", "--xs", "x", "--zs", "inputs", "--feed", "attention_mask=ones",
            "--feed", f"input_ids={tmp_path / 'ids.npy'}"]
    assert main(args) == 0
    assert "dy/dx: shape (1, 6, 4)" in capsys.readouterr().out  # the mask took seq=6 from the file
    assert main(args + ["--dim", "seq=4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "onnxgrad: error: feed 'input_ids': expected int64 [batch, seq], got int64 [1, 6]; seq is set to 4, not 6")


@pytest.mark.parametrize("args, message", [
    (["--dim", "seq"], "bad dim 'seq': write NAME=N"),
    (["--dim", "sequence=4"], "'sequence' is not a symbolic dim of this model"),
])
def test_cli_bad_dims_are_one_line(lm_path, capsys, args, message):
    assert main(["grad", lm_path, "--y", "y", "--xs", "x", "--zs", "inputs", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_cli_zs_inputs_still_refuses_what_is_wrong(lm_path, capsys):
    assert main(["grad", lm_path, "--y", "y", "--xs", "W", "--zs", "input_ids"]) == 2
    assert "it depends on 'attention_mask', which is in neither" in capsys.readouterr().err
    assert main(["check", lm_path, "--y", "y", "--xs", "W", "--zs", "inputs", "--dim", "seq=3", "--mode", "fast",
                 "--feed", "input_ids=random"]) == 0


def test_explore_refuses_a_bad_dim_in_one_line(lm_path, capsys):
    from explorer.launcher import main as onnxgrad

    assert onnxgrad(["explore", lm_path, "--dim", "seq=two"]) == 2
    assert capsys.readouterr().err.strip() == ("onnxgrad: error: bad dim 'seq=two': write NAME=N with N a positive "
                                               "integer, e.g. seq=32,batch=2")
