"""The diff report's HTML file in a real browser: headless Chromium (Debian's `chromium`) draws the graph
in the diverging colour and follows the links to a node and to a table row. Skipped where Chromium (or
Pillow, which counts the pixels) is absent."""
from __future__ import annotations

import shutil
import subprocess

import pytest

import engine
from engine.diff.html import DIVERGING, report_html
from engine.diff.report import DiffReport, NodeDiff

from .test_diff_html import hand_report, odd_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian's chromium package)")
Image = pytest.importorskip("PIL.Image", reason="needs Pillow to count the screenshot's pixels")

TARGET_ROW = (0xff, 0xf3, 0xb0)  # tr:target td in the report's CSS
TARGET_NODE = (0x1f, 0x5f, 0xbf)  # a.node:target rect's stroke


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def screenshot(tmp_path, page, fragment: str = "", size: str = "1200,3000") -> dict:
    """The page as Chromium draws it: how many pixels of each colour."""
    shot = tmp_path / f"shot{fragment.replace('#', '_')}.png"
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={size}",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=90)
    if not shot.exists():
        pytest.skip(f"chromium did not take a screenshot (exit {done.returncode}): {done.stderr[-300:]}")
    with Image.open(shot) as im:
        return {colour: count for count, colour in im.convert("RGB").getcolors(maxcolors=1 << 20)}


@pytest.fixture
def pages(tmp_path):
    graph = engine.load(odd_model(tmp_path / "odd.onnx")).graph
    diverging = tmp_path / "diverging.html"
    diverging.write_text(report_html(hand_report(graph), graph), encoding="utf-8")
    calm = hand_report(graph)
    calm = DiffReport(calm.a, calm.b, calm.mode, nodes=tuple(
        NodeDiff(n.node, n.op_type, n.where, n.order, local_error=1e-6, tolerance=1e-3) for n in calm.nodes))
    agrees = tmp_path / "agrees.html"
    agrees.write_text(report_html(calm, graph), encoding="utf-8")
    return graph, diverging, agrees


def test_chromium_draws_the_culprit_in_the_diverging_colour(tmp_path, pages):
    graph, diverging, agrees = pages
    red = rgb(DIVERGING)
    assert screenshot(tmp_path, diverging).get(red, 0) > 400  # the culprit's box (about 50×22 px) and its swatch
    assert screenshot(tmp_path, agrees).get(red, 0) == 0


def test_chromium_follows_links_to_a_node_and_to_a_row(tmp_path, pages):
    graph, diverging, _ = pages
    add = graph.node_names.index("add")
    plain = screenshot(tmp_path, diverging)
    assert plain.get(TARGET_NODE, 0) == 0 and plain.get(TARGET_ROW, 0) == 0
    # The table row's link goes to the node: the browser marks it as the target (a blue outline).
    assert screenshot(tmp_path, diverging, f"#fwd-node-{add}").get(TARGET_NODE, 0) > 100
    # The node's link goes to its row: highlighted as the target.
    assert screenshot(tmp_path, diverging, f"#row-fwd-{add}").get(TARGET_ROW, 0) > 1000
