"""The diff as Model Explorer node data: keyed by the graph and node ids model-explorer-onnx gives A's
graph, valued by local error over tolerance, coloured as the HTML report colours. The check against
Model Explorer's own adapter and node-data classes runs where `ai-edge-model-explorer` and
`model-explorer-onnx` install, and is skipped elsewhere (they are not requirements of onnxgrad)."""
from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

import engine
from engine.modeldiff.html import DIVERGING
from engine.modeldiff.node_data import BEYOND, explorer_node_ids, model_explorer_node_data

from .test_diff_html import ODD, hand_report, odd_model


@pytest.fixture
def graph(tmp_path):
    return engine.load(odd_model(tmp_path / "odd.onnx")).graph


def test_node_data_is_keyed_by_graph_and_node_ids(graph):
    report = hand_report(graph)
    data = model_explorer_node_data(report, "forward", graph)
    assert list(data) == ["odd"]
    results = data["odd"]["results"]
    # The unnamed Sigmoid is the engine's "Sigmoid_1" and the adapter's "node" (onnx_ir's NameFixPass).
    assert set(results) == {ODD, "node", "tanh", "add", "scale"}
    assert results["add"] == {"value": 500.0, "bgColor": DIVERGING}  # 0.5 / 1e-3
    assert all(r["value"] <= 1 and r["bgColor"] != DIVERGING for k, r in results.items() if k != "add")
    gradient = model_explorer_node_data(report, "gradient", graph)["odd"]["results"]
    assert all(r["bgColor"] != DIVERGING for r in gradient.values())
    json.dumps(data, allow_nan=False)  # strict JSON: no NaN or Infinity


def test_without_a_graph_names_are_used_and_infinite_ratios_stay_json(graph):
    report = hand_report(graph)
    broken = report.nodes[0].__class__(**{**report.nodes[0].__dict__, "local_error": float("nan")})
    report = report.__class__(**{**report.__dict__, "nodes": (broken,) + report.nodes[1:]})
    data = model_explorer_node_data(report)
    results = data["<main>"]["results"]
    assert set(results) == set(graph.node_names) and results[broken.node]["value"] == BEYOND
    json.dumps(data, allow_nan=False)
    with pytest.raises(ValueError, match="where"):
        model_explorer_node_data(report, "backward")


def test_model_explorer_loads_the_node_data(graph, tmp_path):
    try:
        from model_explorer import node_data_builder as ndb
        from model_explorer_onnx.main import ONNXAdapter
    except ImportError as missing:
        pytest.skip(f"Model Explorer is not installed ({missing})")
    model = odd_model(tmp_path / "odd.onnx")
    graphs = ONNXAdapter().convert(model, {})["graphs"]
    ids = {g.id: {n.id for n in g.nodes} for g in graphs}
    data = model_explorer_node_data(hand_report(graph), "forward", graph)
    for graph_id, gd in data.items():
        assert set(gd["results"]) <= ids[graph_id]  # every value lands on a node the viewer draws
        parsed = ndb.GraphNodeData(
            name=gd["name"], results={k: ndb.NodeDataResult(**v) for k, v in gd["results"].items()},
            thresholds=[ndb.ThresholdItem(**t) for t in gd["thresholds"]])
        written = json.loads(ndb.ModelNodeData(graphsData={graph_id: parsed}).to_json_string())
        assert written[graph_id]["results"] == gd["results"] and written[graph_id]["thresholds"] == gd["thresholds"]


def test_model_explorer_names_unnamed_and_repeated_nodes_as_we_do(tmp_path):
    try:
        from model_explorer_onnx.main import ONNXAdapter
    except ImportError as missing:
        pytest.skip(f"Model Explorer is not installed ({missing})")
    names = ["node", "", "dup", "dup", "", "dup_1"]
    nodes = [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"], name=n) for k, n in enumerate(names)]
    graph = helper.make_graph(nodes, "names", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(f"t{len(names)}", TensorProto.FLOAT, [2])])
    path = tmp_path / "names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (converted,) = ONNXAdapter().convert(str(path), {})["graphs"]
    theirs = [n.id for n in converted.nodes if not n.id.startswith("[value]")]
    ours = explorer_node_ids(engine.load(str(path)).graph)
    assert converted.id == "names" and list(ours.values()) == theirs and len(set(theirs)) == len(names)
