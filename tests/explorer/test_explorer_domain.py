"""The explorer's plain-Python parts: session state, feeds, rules, step trace, search, canvas."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.errors import FeedError
from engine.graphs import Canvas
from explorer.feeding import FeedSource, evaluate_expression, materialize, referenced_names, source_from
from explorer.rules import GENERIC, rule_lines
from explorer.search import fuzzy_score, search
from explorer.state import Session, active_nodes
from explorer.stepper import trace
from explorer.summaries import array_stats
from explorer.widgets.node_list import entries_for
from explorer.widgets.visuals import heatmap, histogram, parse_slice

from .conftest import sample


def session(model, **kw) -> Session:
    return Session(model, "test", **kw)


# --- selection -------------------------------------------------------------------------------------
def test_selection_follows_the_spec_and_explains_refusals(spec_model):
    s = session(spec_model)
    s.set_y("Y")
    assert s.spec is None and "xs" in s.selection_error
    s.toggle_x("W")
    assert "'X'" in s.selection_error and "zs" in s.selection_error  # y depends on X, in neither
    s.toggle_z("X")
    s.toggle_x("Z")
    assert s.spec == spec_model.selection("Y", ["W", "Z"], ["X"]) and s.selection_error is None
    s.toggle_x("H")
    assert s.spec is None
    assert s.selection_error == "'H' cannot be in xs: it is determined by 'W' and 'X', so it is not an independent variable"


def test_a_tensor_has_one_role_at_a_time(spec_model):
    s = session(spec_model)
    s.toggle_x("W")
    s.toggle_z("W")
    assert s.xs == () and s.zs == ("W",)
    s.set_y("W")
    assert s.zs == () and s.y == "W" and s.role_of("W") == "y"
    s.toggle_x("W")
    assert s.y is None and s.xs == ("W",)


def test_every_change_invalidates_results_and_old_results_are_dropped(spec_model):
    s = session(spec_model)
    s.select("Y", ["W", "Z"], ["X"])
    job = s.gradient_job()
    result, stats = job.run()
    s.toggle_dtype()
    assert not s.accept_gradient(job.generation, result, stats)
    assert s.gradient is None
    job = s.gradient_job()
    assert s.accept_gradient(job.generation, *job.run())
    assert s.gradient.grads["W"].dtype == np.float64


def test_slice_is_the_nodes_between_xs_and_y(spec_model):
    g = spec_model.graph
    names = lambda idx: sorted(g.node_names[i] for i in idx)  # noqa: E731
    assert names(active_nodes(g, "Y", ["W", "Z"], ["X"])) == ["conv", "flatten", "gemm"]
    assert names(active_nodes(g, "Y", ["Z"], ["H"])) == ["gemm"]  # cut at H: conv is upstream


# --- feeds -------------------------------------------------------------------------------------------
def test_default_feed_is_random_seed_1_for_the_first_input(spec_model):
    s = session(spec_model)
    source, explicit = s.feed_source("X")
    assert source == FeedSource("random", seed=1) and not explicit
    assert s.feed_source("H") == (None, False)
    np.testing.assert_array_equal(s.feed_values()["X"], engine.examples.default_feeds()["X"])


def test_feed_sources_make_the_declared_shape_and_dtype(spec_model, tmp_path):
    s = session(spec_model)
    np.save(tmp_path / "x.npy", np.full((1, 1, 4, 4), 3.0, np.float32))
    for source, expected in [(FeedSource("zeros"), 0.0), (FeedSource("ones"), 1.0),
                             (FeedSource("constant", constant=2.5), 2.5),
                             (FeedSource("npy", path=str(tmp_path / "x.npy")), 3.0)]:
        s.set_feed("X", source)
        value = s.feed_values()["X"]
        assert value.shape == (1, 1, 4, 4) and value.dtype == np.float32
        assert np.all(value == expected)


def test_expression_feeds_read_other_feeds_and_constants(spec_model):
    s = session(spec_model)
    s.set_feed("X", FeedSource("constant", constant=2.0))
    s.set_feed("H", source_from("expression", "X[0, 0, :2, :2] * 3 + sum(W) * 0"))
    assert np.all(s.feed_values()["H"] == 6.0) and s.feed_values()["H"].shape == (1, 2, 2, 2)


def test_bad_feeds_are_refused_with_the_reason_and_change_nothing(spec_model, tmp_path):
    s = session(spec_model)
    with pytest.raises(FeedError, match="does not broadcast"):
        s.set_feed("H", FeedSource("expression", expression="X[0, 0, 0, :3]"))
    with pytest.raises(FeedError, match="no such file"):
        s.set_feed("X", FeedSource("npy", path=str(tmp_path / "missing.npy")))
    with pytest.raises(FeedError, match="neither fed nor a constant"):
        s.set_feed("X", FeedSource("expression", expression="2 * H"))
    assert s.feeds == {}
    with pytest.raises(FeedError, match="cannot parse"):
        source_from("expression", "2 *")
    with pytest.raises(FeedError, match="Attribute"):
        source_from("expression", "X.__class__")
    with pytest.raises(FeedError, match="cycle: X -> H -> X"):
        materialize(spec_model.graph, {"X": FeedSource("expression", expression="H"),
                                       "H": FeedSource("expression", expression="X")}, lambda n: None)


def test_a_typed_spec_wins_over_the_chosen_kind():
    assert source_from("random", "zeros") == FeedSource("zeros")
    assert source_from("random", "random:7") == FeedSource("random", seed=7)
    assert source_from("constant", "=2*X") == FeedSource("expression", expression="2*X")
    assert source_from("random", "a.npy") == FeedSource("npy", path="a.npy")
    with pytest.raises(FeedError, match="integer"):
        source_from("random", "x")


@settings(max_examples=40, deadline=None)
@given(a=st.floats(-1e3, 1e3), b=st.floats(-1e3, 1e3), c=st.floats(0.1, 10))
def test_expressions_compute_what_numpy_computes(a, b, c):
    env = {"A": np.float64(a), "B": np.float64(b), "C": np.float64(c)}
    got = evaluate_expression("A * B - A / C + abs(B) ** 0.5 + tanh(A)", env.__getitem__)
    want = a * b - a / c + abs(b) ** 0.5 + np.tanh(a)
    assert np.isclose(got, want, rtol=1e-12, atol=1e-9)
    assert sorted(referenced_names("A * t('B') + sin(C)")) == ["A", "B", "C"]


# --- gradient jobs and the report ---------------------------------------------------------------------
def test_gradient_at_a_fed_intermediate_matches_the_engine(spec_model):
    s = session(spec_model)
    s.select("Y", ["H", "Z"])
    s.set_feed("H", FeedSource("constant", constant=0.5))
    result, _ = s.gradient_job().run()
    want = spec_model.gradient("Y", ["H", "Z"], feeds={"H": np.full((1, 2, 2, 2), 0.5, np.float32)})
    for x in ("H", "Z"):
        np.testing.assert_allclose(result.grads[x], want.grads[x], rtol=1e-6)


def test_an_unfed_intermediate_x_takes_the_value_the_model_computes(spec_model):
    s = session(spec_model)
    s.select("Y", ["H", "Z"])
    result, _ = s.gradient_job().run()
    h = spec_model.run(s.feed_values(), outputs=["H"])["H"]
    np.testing.assert_array_equal(result.values["H"], h)


def test_report_is_json_and_carries_selection_feeds_and_stats(spec_model):
    s = session(spec_model)
    s.select("Y", ["W", "Z"], ["X"])
    job = s.gradient_job()
    s.accept_gradient(job.generation, *job.run())
    data = json.loads(json.dumps(s.report()))
    assert data["xs"] == ["W", "Z"] and data["feeds"]["X"] == "random(seed=1)"
    norm = float(np.linalg.norm(s.gradient.grads["W"].astype(np.float64)))
    assert data["gradients"]["W"]["norm"] == pytest.approx(norm)


def test_array_stats_count_non_finite_values():
    s = array_stats(np.array([1.0, np.nan, -3.0, np.inf]))
    assert s["nonfinite"] == 2 and s["min"] == -3.0 and s["max"] == 1.0


# --- rules and step mode ----------------------------------------------------------------------------
def test_every_registered_op_has_a_rule_line_per_input():
    from engine.registry import records

    # op types with one rule text outside com.microsoft, as the records hold them (Gemm's vary)
    described = {r.op_type for r in records() if r.domain != "com.microsoft" and r.rule is not None and not r.rule_by}
    for impl in engine.supported_ops():
        node = helper.make_node(impl.op_type, ["a", "b", "c"], ["y"], domain=impl.domain)
        lines = rule_lines(node, impl.since)
        assert len(lines) == 3, impl.op_type
        if impl.domain == "com.microsoft" or impl.op_type == "SimplifiedLayerNormalization":
            assert lines[0][1] != GENERIC.format(input=lines[0][0], op=impl.op_type), impl.op_type
        elif impl.op_type not in described and impl.op_type != "Gemm":
            assert lines[0][1] == GENERIC.format(input=lines[0][0], op=impl.op_type)


@pytest.mark.parametrize("flags,want_a,want_b", [
    ({}, "dA = dY · Bᵀ", "dB = Aᵀ · dY"),
    ({"transA": 1, "alpha": 0.5}, "dA = 0.5·B · dYᵀ", "dB = 0.5·A · dY"),
    ({"transB": 1}, "dA = dY · B", "dB = dYᵀ · A"),
    ({"transA": 1, "transB": 1, "beta": 2.0}, "dA = Bᵀ · dYᵀ", "dB = dYᵀ · Aᵀ"),
])
def test_gemm_rules_follow_trans_flags_and_alpha(flags, want_a, want_b):
    lines = dict(rule_lines(helper.make_node("Gemm", ["a", "b", "c"], ["y"], **flags), 13))
    assert lines["A"] == want_a and lines["B"] == want_b
    assert lines["C"] == ("dC = 2·unbroadcast(dY)" if flags.get("beta") == 2.0 else "dC = unbroadcast(dY)")


def test_mul_rule_reads_like_the_textbook():
    assert rule_lines(helper.make_node("Mul", ["a", "b"], ["y"]), 14) == [
        ("A", "dA = unbroadcast(dY · B)"), ("B", "dB = unbroadcast(dY · A)")]


def test_step_trace_ends_with_the_engines_gradient(spec_model):
    spec = spec_model.selection("Y", ["W", "Z"], ["X"])
    feeds = engine.examples.default_feeds()
    t = trace(spec_model, spec, feeds)
    want = spec_model.gradient("Y", ["W", "Z"], ["X"], feeds)
    for x in spec.xs:
        np.testing.assert_allclose(t.grads[x], want.grads[x], rtol=1e-6, atol=1e-7)
    assert [f.op_type for f in t.frames] == ["Conv", "Flatten", "Gemm", "Gemm", "Flatten", "Conv"]
    gemm = t.frames[3]
    assert [o.tensor for o in gemm.outgoing] == ["H_flat", "Z"] and gemm.outgoing[0].rule == "dA = dY · Bᵀ"
    conv = t.frames[-1]
    assert conv.outgoing[0].contribution is None and "does not depend on xs" in conv.outgoing[0].note


def test_step_trace_accumulates_at_fan_out():
    model = engine.load(sample("residual_fanout.onnx"))
    spec = model.selection("loss", ["X", "W"])
    t = trace(model, spec, {})
    want = model.gradient("loss", ["X", "W"])
    for x in spec.xs:
        np.testing.assert_allclose(t.grads[x], want.grads[x], rtol=1e-5, atol=1e-6)
    notes = [o.note for f in t.frames for o in f.outgoing if o.note.startswith("fan-out")]
    assert any("contribution 2 of 2" in n for n in notes)


def test_step_trace_handles_an_input_used_twice():
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])
    g = helper.make_graph([helper.make_node("Mul", ["X", "X"], ["S"]), helper.make_node("ReduceSum", ["S"], ["Y"], keepdims=0)],
                          "square", [x], [y])
    model = engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    value = np.array([1.0, -2.0, 3.0], np.float32)
    t = trace(model, model.selection("Y", ["X"]), {"X": value})
    np.testing.assert_allclose(t.grads["X"], 2 * value)


# --- list search, canvas, visuals ---------------------------------------------------------------------
def test_fuzzy_search_prefers_exact_then_subsequence(spec_model):
    entries = entries_for(spec_model.graph)
    assert [e.name for e in search(entries, "hflat")][:1] == ["H_flat"]
    assert search(entries, "gem")[0].name == "gemm"
    assert fuzzy_score("xyz", "gemm") == 0 and search(entries, "") == entries


def test_canvas_draws_the_boxes_and_arrows_of_a_layout(spec_model):
    layout = engine.layout_graph(spec_model)
    canvas = Canvas(layout)
    text = "\n".join("".join(r.text for r in canvas.row(y, 0, layout.width)) for y in range(layout.height))
    for n in layout.nodes:
        assert n.label in text
    assert text.count("▼") >= len(layout.edges) // 2
    box = layout.nodes[0]
    assert canvas.node_at(box.x + 1, box.y + 1) is box
    runs = canvas.row(box.y, box.x, 3)
    assert runs[0].owner == ("box", box.id) and runs[0].text == "┌──"


def test_heatmap_windows_around_the_focus_and_slices_are_parsed():
    a = np.arange(2 * 3 * 40 * 40, dtype=np.float32).reshape(2, 3, 40, 40)
    assert parse_slice("1, 2", a.shape) == ((1, 2), "1,2,:,:")
    with pytest.raises(ValueError, match="out of range"):
        parse_slice("5", a.shape)
    text = heatmap(a, (1, 2), focus=(30, 5)).plain
    assert "rows 22–37 of 40" in text and "◆" in text
    assert "all 4 values" in histogram(np.ones(4)).plain


@pytest.mark.cuda
def test_cuda_is_offered_and_computes_the_same_gradients(spec_model):
    s = session(spec_model, dtype="float64")
    s.select("Y", ["W", "Z"], ["X"])
    cpu, _ = s.gradient_job().run()
    assert s.cycle_device() == "cuda"
    gpu, _ = s.gradient_job().run()
    assert gpu.device.startswith("cuda")
    for x in ("W", "Z"):
        np.testing.assert_allclose(gpu.grads[x], cpu.grads[x], rtol=1e-10)
    t = trace(spec_model, s.spec, s.feed_values(), device="cuda", dtype="float64")
    np.testing.assert_allclose(t.grads["W"], cpu.grads["W"], rtol=1e-10)
