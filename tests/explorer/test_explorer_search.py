"""Search ranks exact > prefix > substring > op/shape > fuzzy: on every name of densenet121 and in the app."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from explorer import messages as m
from explorer.app import make_app
from explorer.search import EXACT, EXACT_ANY_CASE, PREFIX, SUBSTRING, SearchIndex, rank
from explorer.widgets.node_list import entries_for

from .conftest import DENSENET, of_type, opened, settle

needs_densenet = pytest.mark.skipif(not os.path.exists(DENSENET), reason="the onnx package ships without light models")


@pytest.fixture(scope="module")
def densenet_index() -> SearchIndex:
    return SearchIndex(entries_for(engine.load(DENSENET).graph))


@needs_densenet
def test_every_densenet_name_finds_itself_first(densenet_index):
    entries = densenet_index.entries
    assert len(entries) == 4341 and len({e.name for e in entries}) == 4341
    wrong = [(e.name, hit[0].name if hit else None) for e in entries
             if (hit := densenet_index.search(e.name, limit=5))[:1] != [e]]
    assert wrong == []


@needs_densenet
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hits_come_in_tiers_for_any_part_of_any_name(densenet_index, data):
    """A query cut from a name, in any case: hits holding it come first, prefixes before the rest."""
    entries = densenet_index.entries
    name = data.draw(st.sampled_from([e.name for e in entries]))
    start = data.draw(st.integers(0, len(name) - 1))
    stop = data.draw(st.integers(start + 1, len(name)))
    query = data.draw(st.sampled_from([str.lower, str.upper, str.title, str]))(name[start:stop])
    low = query.lower()
    hits = densenet_index.search(query, limit=len(entries))
    holding = [(rank(query, e.name), k) for k, e in enumerate(entries) if low in e.name.lower()]
    assert [e.key for e in hits[:len(holding)]] == [entries[k].key for _, k in sorted(holding)]
    tiers = [rank(query, e.name)[0] for e in hits[:len(holding)]]
    assert tiers == sorted(tiers) and set(tiers) <= {EXACT, EXACT_ANY_CASE, PREFIX, SUBSTRING}
    if query == name:
        assert hits[0].name == name
    elif start == 0:
        assert rank(query, hits[0].name)[0] <= PREFIX


def test_ranking_tiers_and_fuzzy_fallback():
    from explorer.search import DETAIL, FUZZY, search
    from explorer.widgets.node_list import Entry

    names = ["ConstantOfShape_10", "ConstantOfShape_0", "x_constantofshape_0", "constantofshape_0_b",
             "constantofshape_0", "cos"]
    entries = [Entry(f"t:{n}", n, "Conv" if n == "cos" else "", None, n) for n in names]
    got = [(e.name, rank("ConstantOfShape_0", e.name, e.detail)[0]) for e in search(entries, "ConstantOfShape_0")]
    assert got == [("ConstantOfShape_0", EXACT), ("constantofshape_0", EXACT_ANY_CASE),
                   ("constantofshape_0_b", PREFIX), ("x_constantofshape_0", SUBSTRING),
                   ("ConstantOfShape_10", FUZZY)]  # a subsequence, ranked last although its run is long
    assert [e.name for e in search(entries, "conv")] == ["cos"] and rank("conv", "cos", "Conv")[0] == DETAIL
    assert search(entries, "qqq") == [] and search(entries, "  ") == entries


def _named_chain():
    """Relu chain whose tensors are named as torch exports them: one name a prefix of another."""
    names = ["onnx::Conv_98", "onnx::Conv_8", "onnx::Conv_82", "onnx::Conv_820", "output"]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", [a], [b], name=f"/relu{k}") for k, (a, b) in
             enumerate(zip(["input"] + names[:-1], names))]
    g = helper.make_graph(nodes, "named", [x], [y])
    return engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("query", ["onnx::Conv_82", "onnx::Conv_8", "ONNX::CONV_98"])
async def test_typing_an_exact_name_and_enter_selects_that_tensor(query, recorded):
    seen, hook = recorded
    app = make_app(model=_named_chain(), label="named")
    app.raise_errors = True
    async with opened(app, hook) as pilot:
        await pilot.press("slash", *query, "enter")
        await settle(app, pilot)
        want = next(t for t in app.session.graph.producer if t.lower() == query.lower())
        assert app.cursor[1] == want and of_type(seen, m.CursorMoved)[-1].tensor == want
        assert app.focused is app.query_one("#graph")
