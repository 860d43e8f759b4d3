"""The navigator (issue 10, item 5): grouped rows with nodes near the top, weights collapsed until
asked for, and labels cut so that distinct names never look the same."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import engine
from explorer.app import make_app
from explorer.widgets.labels import fit_labels, middle_cut

from ..big_models import residual_chain
from .conftest import SIZE, settle, started


def app_on(model, label: str):
    app = make_app(model=engine.load(model), label=label)
    app.raise_errors = True
    return app


def visible_rows(listing) -> list[str]:
    return ["".join(seg.text for seg in listing.render_line(y)).rstrip()
            for y in range(listing.scrollable_content_region.height)]


async def test_nodes_come_before_the_weights_which_open_on_enter():
    app = app_on(residual_chain(300), "chain")  # 1,201 nodes, 301 initializers
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        listing = app.query_one("#node-options")
        rows = listing.entries
        assert [e.name for e in rows[:5]] == ["Inputs (1)", "input", "Outputs (1)", "loss", "Nodes (1,201)"]
        assert rows[5].node_index == 0 and rows[6].tensor == "block0.conv"
        order = [e.node_index for e in rows if e.node_index is not None]
        assert order == list(range(1201))  # topological order, every node once
        assert rows[-1].name == "Weights (301)" and not any(e.tensor == "mix" for e in rows)
        shown = visible_rows(listing)
        assert shown[0].startswith("▾ Inputs") and any("◆ block0/conv" in r for r in shown)
        listing.focus()
        await pilot.press("end", "enter")
        await settle(app, pilot)
        rows = listing.entries
        weights = rows[rows.index(next(e for e in rows if e.key == "g:weights")) + 1:]
        assert [e.tensor for e in weights][:2] == ["mix", "block0.conv.weight"] and len(weights) == 301
        assert listing.highlighted == len(rows) - 302  # still on the heading, now open
        assert app.cursor == (None, "input")  # a heading moves no cursor
        await pilot.press("enter")
        await settle(app, pilot)
        assert listing.entries[-1].key == "g:weights"
        assert len(listing.entries) == len(rows) - 301


async def test_a_weight_reached_from_elsewhere_opens_its_group():
    app = app_on(residual_chain(20), "chain")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.move_cursor(None, "block7.conv.weight")  # where a search hit or a results row ends up
        await settle(app, pilot)
        listing = app.query_one("#node-options")
        assert app.cursor == (None, "block7.conv.weight")
        assert listing.entries[listing.highlighted].tensor == "block7.conv.weight"
        graph = app.query_one("#graph")  # no box for a weight here (81 nodes): its reader's is selected
        reader = app.session.graph.node_names.index("block7/conv")
        assert not graph.ids_for(tensor="block7.conv.weight") and graph.selected in graph.ids_for(node_index=reader)



@pytest.mark.parametrize("query", [
    "block17.conv.weight",  # a weight, in the Weights group, closed
    "block18/mix",  # a node far below the first screen
    "block19.relu",  # a tensor a node produces
])
async def test_enter_on_a_search_hit_shows_it_selected_in_the_whole_list(query):
    """Enter closes the search: the list shows every row again, scrolled to the hit, highlighted
    (not the row at the hit's place among the hits: the top heading)."""
    app = app_on(residual_chain(20), "chain")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        graph = app.session.graph
        node = graph.node_names.index(query) if query in graph.node_names else None
        cursor = (node, graph.nodes[node].output[0]) if node is not None else (None, query)
        await pilot.press("slash", *query, "enter")
        await settle(app, pilot)
        listing = app.query_one("#node-options")
        assert app.cursor == cursor and app.focused is app.query_one("#graph")
        # the graph selects the node's box, the tensor's producer, the weight's reader (no box of its own)
        near = node if node is not None else graph.producer.get(query, graph.consumers.get(query, [None])[0])
        assert app.query_one("#graph").selected in app.query_one("#graph").ids_for(node_index=near)
        assert app.query_one("#inspector").tensor == cursor[1]
        assert app.query_one("#node-search").value == "" and any(e.key == "g:inputs" for e in listing.entries)
        assert listing.entries[listing.highlighted].key == (f"n:{node}" if node is not None else f"t:{query}")
        row = listing.highlighted - int(listing.scroll_y)
        rows = visible_rows(listing)
        assert 0 <= row < len(rows) and rows[row].lstrip("◆ ").startswith(query)


def batchnorm_names_model():
    """A Detectron-style model: four BatchNorm parameters per layer that differ only at the end."""
    x = helper.make_tensor_value_info("gpu_0/data", TensorProto.FLOAT, [1, 2, 3, 3])
    y = helper.make_tensor_value_info("gpu_0/res2_0_branch1_bn_out", TensorProto.FLOAT, [1, 2, 3, 3])
    stem = "gpu_0/res2_0_branch1_bn"
    params = {f"{stem}_s": np.ones(2), f"{stem}_b": np.zeros(2), f"{stem}_rm": np.zeros(2), f"{stem}_riv": np.ones(2)}
    node = helper.make_node("BatchNormalization", ["gpu_0/data", *params], [y.name], name=f"{stem}_node")
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    model = helper.make_model(helper.make_graph([node], "bn", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


async def test_visible_labels_stay_distinct_when_names_share_a_long_prefix():
    app = app_on(batchnorm_names_model(), "bn")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        listing = app.query_one("#node-options")
        listing.focus()
        await pilot.press("end", "enter")  # open the weights
        await settle(app, pilot)
        width = listing.scrollable_content_region.width
        names = [e.name for e in listing.entries if e.group is None]
        assert max(len(n) for n in names) > width  # the premise: the names do not fit
        labels = [listing.label(n, width - 2) for n in names]
        assert len(set(labels)) == len(set(names))
        shown = [r for r in visible_rows(listing) if r.startswith("  gpu_0/res2")]
        # the output shows twice (under Outputs and under its node): five names, five labels
        assert len(shown) == 6 and len({r.split(" [")[0] for r in shown}) == 5
        assert any(r.rstrip().startswith("  gpu_0/res2") and "_riv" in r for r in shown)  # the tail is kept


names_sharing_prefixes = st.lists(
    st.builds(lambda stem, mid, tail: stem + mid + tail,
              st.sampled_from(["gpu_0/res2_0_branch1_bn", "model/encoder/layer", "", "x" * 30]),
              st.text("ab_/.0123456789", max_size=12), st.text("abc_sbrmiv", max_size=6)),
    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(names=names_sharing_prefixes, width=st.integers(3, 40))
def test_fit_labels_are_unique_whenever_the_names_are(names, width):
    labels = fit_labels(names, width)
    distinct = set(names)
    assert set(labels) == distinct
    assert len(set(labels.values())) == len(distinct)
    for name, label in labels.items():
        assert len(label) <= width
        if len(name) <= width:
            assert label == name


def test_a_cut_keeps_the_head_and_the_distinguishing_tail():
    assert middle_cut("gpu_0/res2_0_branch1_bn_riv", 16, 7) == "gpu_0/re…_bn_riv"
    labels = fit_labels([f"gpu_0/res2_0_branch1_bn_{t}" for t in ("s", "b", "rm", "riv")], 16)
    assert all(label.endswith(t) for label, t in zip(labels.values(), ("_s", "_b", "_rm", "_riv")))
