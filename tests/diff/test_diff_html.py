"""The diff report's HTML file: well-formed, self-contained, every node linked to its table row and
back, the culprit in the diverging colour, every name escaped. Reports are built by hand, so these
tests hold whatever the comparison computes; the browser tests are in test_diff_html_browser.py."""
from __future__ import annotations

import math
import re
from html import escape
from html.parser import HTMLParser

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import engine
from engine.modeldiff import html as diff_html
from engine.modeldiff.html import DIVERGING, NOT_COMPARED, graph_edges, report_html
from engine.modeldiff.report import DiffReport, Divergence, NodeDiff, Unmatched

ODD = 'relu<in>&"1\''  # a node name that breaks HTML unless escaped
VOID = {"meta", "br", "img", "input", "link", "hr"}


def odd_model(path) -> str:
    """X → Relu (odd name) → {Sigmoid (unnamed), Tanh} → Add → Mul by W: a fork, a join, an unnamed node."""
    nodes = [helper.make_node("Relu", ["X"], ["t1"], name=ODD),
             helper.make_node("Sigmoid", ["t1"], ["t2"]),
             helper.make_node("Tanh", ["t1"], ["t3"], name="tanh"),
             helper.make_node("Add", ["t2", "t3"], ["t4"], name="add"),
             helper.make_node("Mul", ["t4", "W"], ["Y"], name="scale")]
    graph = helper.make_graph(
        nodes, "odd", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor("W", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


@pytest.fixture
def graph(tmp_path):
    return engine.load(odd_model(tmp_path / "odd.onnx")).graph


def hand_report(graph, culprit: str = "add", skip: tuple[str, ...] = ()) -> DiffReport:
    """Forward rows in topological order, gradient rows in reverse; `culprit` diverges forward, its
    consumers inherit the error; the `skip` nodes are not compared."""
    names = [n for n in graph.node_names if n not in skip]
    rows = []
    for where, order in (("forward", names), ("gradient", names[::-1])):
        for k, name in enumerate(order):
            bad = where == "forward" and name == culprit
            op = graph.nodes[graph.node_names.index(name)].op_type
            rows.append(NodeDiff(name, op, where, k, outputs=(f"{name}:out",), error=0.5 if bad else 1e-5 * (k + 1),
                                 local_error=0.5 if bad else 1e-6 * (k + 1), tolerance=1e-3, diverges=bad,
                                 input_errors=((f"{name}<in>", 1e-6),), note="changed" if bad else ""))
    return DiffReport("a.onnx", 'b "<cast>".onnx', "models", y="Y", xs=("X",), nodes=tuple(rows),
                      culprits=(Divergence(culprit, "forward", 0.5, 1e-3, op_type="Add"),),
                      unmatched=(Unmatched("b", "cast<&>", producer="Cast_0", why="inserted by the cast"),))


class Page(HTMLParser):
    """What the tests look at: ids, links, the fill of each SVG node, the text, and tag balance."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.ids, self.hrefs, self.fills, self.stack, self.errors, self.text = {}, [], {}, [], [], []
        self.node_links, self.row_links, self.refs = {}, {}, []
        self._node = self._row = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if "id" in a:
            if a["id"] in self.ids:
                self.errors.append(f"duplicate id {a['id']}")
            self.ids[a["id"]] = tag
        self.refs += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v and not v.startswith("#")]
        if "-node-" in a.get("id", ""):
            self._node = a["id"]
            if "href" in a:
                self.node_links[a["id"]] = a["href"][1:]
        if tag == "tr" and "row-" in a.get("id", ""):
            self._row = a["id"]
        if tag == "a" and self._row and a.get("href", "").startswith("#"):
            self.row_links[self._row] = a["href"][1:]
        if tag == "rect" and self._node:
            self.fills[self._node] = a["fill"]
        if "href" in a:
            self.hrefs.append(a["href"])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()
        if tag in ("a", "g") and self._node:
            self._node = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        self.text.append(data)


def check_page(text: str, report: DiffReport, whole: bool = True) -> Page:
    """What every report page (or Jupyter fragment) holds, whatever its rows."""
    page = Page(text)
    assert not page.errors and not page.stack, (page.errors, page.stack)
    if whole:
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not re.search(r"https?://|<link\b|@import|url\(", text), "the file must reference nothing outside itself"
    assert not page.refs
    for href in page.hrefs:
        assert href.startswith("#") and href[1:] in page.ids, href
    for row, target in page.row_links.items():  # table → graph
        assert target in page.ids and page.node_links.get(target) == row, (row, target)
    for node, target in page.node_links.items():  # graph → table
        assert page.ids[target] == "tr" and page.row_links[target] == node, (node, target)
    for row in report.nodes:
        assert escape(row.node) in text and escape(row.note) in text
        if row.diverges and page.fills:
            assert any(fill == DIVERGING for node, fill in page.fills.items()), "no node in the diverging colour"
    return page


def test_every_node_and_row_link_to_each_other(graph):
    report = hand_report(graph)
    text = report_html(report, graph)
    page = check_page(text, report)
    n = len(graph.node_names)
    assert len(page.node_links) == 2 * n and len(page.row_links) == 2 * n  # forward and gradient, each node
    add = graph.node_names.index("add")
    assert page.fills[f"fwd-node-{add}"] == DIVERGING  # the culprit, forward
    assert page.fills[f"grad-node-{add}"] != DIVERGING  # its gradient agrees
    assert sum(fill == DIVERGING for fill in page.fills.values()) == 1
    text_only = "".join(page.text)
    assert "first at node add" in text_only and "cast<&>" in text_only and ODD in text_only


def test_names_are_escaped(graph):
    text = report_html(hand_report(graph), graph)
    for raw in (ODD, "cast<&>", 'b "<cast>".onnx', "relu<in>&"):
        assert raw not in text
    assert escape(ODD) in text


def test_uncompared_nodes_are_grey_and_unlinked(graph):
    report = hand_report(graph, skip=("tanh",))
    page = check_page(report_html(report, graph), report)
    tanh = graph.node_names.index("tanh")
    assert page.fills[f"fwd-node-{tanh}"] == NOT_COMPARED and f"fwd-node-{tanh}" not in page.node_links
    assert f"row-fwd-{tanh}" not in page.ids


def test_rows_sort_worst_first_and_by_graph_order(graph):
    report = hand_report(graph)
    rows = re.findall(r'<tr id="row-(\w+)-(\d+)" data-worst="(\d+)" data-order="(\d+)"', report_html(report, graph))
    assert [int(w) for *_, w, _ in rows] == list(range(len(rows)))
    first = rows[0]
    assert (first[0], graph.node_names[int(first[1])]) == ("fwd", "add")
    by_order = sorted(rows, key=lambda r: int(r[3]))
    forward = [graph.node_names[int(k)] for p, k, *_ in by_order if p == "fwd"]
    assert forward == list(graph.node_names)  # topological


def test_report_draws_itself_from_its_edges(graph):
    """Jupyter: no graph at hand, the report's own edges give the same drawing."""
    report = hand_report(graph)
    with_edges = DiffReport(**{**report.__dict__, "edges": graph_edges(graph)})
    assert set(graph_edges(graph)) == {(ODD, "Sigmoid_1"), (ODD, "tanh"), ("Sigmoid_1", "add"), ("tanh", "add"),
                                       ("add", "scale")}
    text = with_edges._repr_html_()
    page = check_page(text, with_edges, whole=False)
    assert text.count("<polyline") == 2 * 5
    assert len(page.node_links) == 10
    bare_text = report._repr_html_()  # no edges: no drawing, still every row
    bare = check_page(bare_text, report, whole=False)
    assert not bare.fills and not bare.row_links and bare_text.count(" data-worst=") == 10
    assert "not drawn" in bare_text


def test_two_reports_in_one_notebook_keep_to_themselves(graph):
    """Jupyter puts outputs in one page: each fragment's ids are its own and its styles touch only it."""
    report = DiffReport(**{**hand_report(graph).__dict__, "edges": graph_edges(graph)})
    first, second = report._repr_html_(), report._repr_html_()
    pages = [check_page(t, report, whole=False) for t in (first, second)]
    assert not set(pages[0].ids) & set(pages[1].ids)
    both = check_page(first + second, report, whole=False)  # links resolve within the one page
    assert len(both.node_links) == 2 * len(pages[0].node_links) == 20
    css = re.search(r"<style>(.*?)</style>", first, re.S).group(1)
    selectors = [sel.strip() for rule in re.findall(r"([^{}]+)\{", css) for sel in rule.split(",")]
    assert selectors and all(sel.startswith(".onnxgrad-diff") for sel in selectors), selectors


def test_big_graph_draws_the_culprits_neighbourhood():
    names = [f"n{i}" for i in range(diff_html.MAX_DRAWN + 500)]
    edges = tuple(zip(names, names[1:]))
    rows = tuple(NodeDiff(n, "Relu", "forward", i, local_error=1.0 if n == "n1700" else 0.0, tolerance=0.1,
                          diverges=n == "n1700") for i, n in enumerate(names))
    report = DiffReport("a", "b", "models", nodes=rows, culprits=(Divergence("n1700", "forward", 1.0, 0.1),),
                        edges=edges)
    text = report_html(report)
    page = check_page(text, report)
    assert len(page.fills) == diff_html.NEIGHBOURHOOD and page.fills["fwd-node-1700"] == DIVERGING
    assert "2,500 nodes" in text and len(page.row_links) == diff_html.NEIGHBOURHOOD
    assert len(text) < 1_500_000


def test_colour_scale():
    def colour(local, tol, diverges=False):
        return diff_html.divergence_colour(NodeDiff("n", "Relu", "forward", 0, local_error=local, tolerance=tol,
                                                    diverges=diverges))
    assert colour(2e-3, 1e-3) == colour(math.nan, 1e-3) == colour(1.0, 0.0) == DIVERGING
    assert colour(0.0, 1e-3) == "#d9f0d3" and colour(1e-3, 1e-3) == "#ffc14d"  # the scale's two ends
    scale = [colour(r * 1e-3, 1e-3) for r in (1e-6, 1e-4, 1e-2, 0.5, 1.0)]
    assert DIVERGING not in scale and len(set(scale)) == 4  # 1e-4 and below share the calm end
    assert scale == sorted(scale, key=lambda c: int(c[1:3], 16))  # warmer as the ratio grows


names = st.text(alphabet=st.sampled_from('ab<>&"\' é/#:-_'), min_size=1, max_size=8)
errors = st.one_of(st.floats(0, 10, allow_nan=False), st.sampled_from([0.0, math.inf, math.nan, 1e-30]))


@settings(max_examples=40, deadline=None)
@given(st.lists(names, min_size=1, max_size=10, unique=True), st.data())
def test_random_reports_are_well_formed_and_self_contained(node_names, data):
    n = len(node_names)
    edges = tuple((node_names[i], node_names[j]) for i, j in data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] < p[1]),
                 max_size=2 * n)))
    rows = []
    for where in ("forward", "gradient"):
        for k, name in enumerate(data.draw(st.lists(st.sampled_from(node_names), unique=True))):
            local, tol = data.draw(errors), data.draw(st.floats(0, 1))
            ratio = diff_html.ratio(NodeDiff(name, "", where, k, local_error=local, tolerance=tol))
            rows.append(NodeDiff(name, data.draw(names), where, k, error=data.draw(errors), local_error=local,
                                 tolerance=tol, diverges=ratio > 1, note=data.draw(names),
                                 input_errors=((data.draw(names), data.draw(errors)),)))
    bad = [r for r in rows if r.diverges]
    report = DiffReport(data.draw(names), data.draw(names), "models", nodes=tuple(rows), edges=edges,
                        culprits=tuple(Divergence(r.node, r.where, r.local_error, r.tolerance) for r in bad[:2]),
                        unmatched=(Unmatched("a", data.draw(names), why=data.draw(names)),))
    text = report_html(report)
    page = check_page(text, report)
    # Without a graph, nodes are numbered in A's order: the forward's, the gradient's reversed, then edge ends.
    in_order = [r.node for r in rows if r.where == "forward"] + [r.node for r in rows if r.where == "gradient"][::-1]
    ids = {name: k for k, name in enumerate(dict.fromkeys(in_order + [x for e in edges for x in e]))}
    if not edges and len(ids) > 1:  # nothing connects them: the page is the table alone
        assert not page.fills and "not drawn" in text
        return
    for row in rows:
        p = "fwd" if row.where == "forward" else "grad"
        fill = page.fills[f"{p}-node-{ids[row.node]}"]
        assert (fill == DIVERGING) == (diff_html.ratio(row) > 1 or row.diverges), (row, fill)
        assert page.node_links[f"{p}-node-{ids[row.node]}"] == f"row-{p}-{ids[row.node]}"
