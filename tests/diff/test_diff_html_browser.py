"""The diff report's HTML file in a real browser: headless Chromium (Debian's `chromium`) draws the graph
in the diverging colour and follows the links to a node and to a table row. Skipped where Chromium (or
Pillow, which counts the pixels) is absent."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import engine
from engine.modeldiff.html import DIVERGING, report_html
from engine.modeldiff.report import DiffReport, NodeDiff

from .test_diff_html import hand_report, odd_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian's chromium package)")
Image = pytest.importorskip("PIL.Image", reason="needs Pillow to count the screenshot's pixels")

TARGET_ROW = (0xff, 0xf3, 0xb0)  # tr:target td in the report's CSS
TARGET_NODE = (0x1f, 0x5f, 0xbf)  # a.node:target rect's stroke


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


FRAME_W, FRAME_H = 1000, 1400
FRAMES = ("diverging.html", "agrees.html", "diverging.html#fwd-node-{add}", "diverging.html#row-fwd-{add}")


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> list[dict]:
    """One Chromium run draws the reports side by side, each in a frame of its own (the last two opened at a
    link's target); per frame, how many pixels of each colour."""
    tmp_path = tmp_path_factory.mktemp("browser")
    graph = engine.load(odd_model(tmp_path / "odd.onnx")).graph
    (tmp_path / "diverging.html").write_text(report_html(hand_report(graph), graph), encoding="utf-8")
    calm = hand_report(graph)
    calm = DiffReport(calm.a, calm.b, calm.mode, nodes=tuple(
        NodeDiff(n.node, n.op_type, n.where, n.order, local_error=1e-6, tolerance=1e-3) for n in calm.nodes))
    (tmp_path / "agrees.html").write_text(report_html(calm, graph), encoding="utf-8")
    add = graph.node_names.index("add")
    (tmp_path / "frames.html").write_text('<!DOCTYPE html><html><body style="margin:0">' + "".join(
        f'<iframe src="{src.format(add=add)}" style="position:absolute;left:{k * FRAME_W}px;top:0;'
        f'width:{FRAME_W}px;height:{FRAME_H}px;border:0"></iframe>' for k, src in enumerate(FRAMES))
        + "</body></html>", encoding="utf-8")
    shot = tmp_path / "frames.png"
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={FRAME_W * len(FRAMES)},{FRAME_H}", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={shot}", (tmp_path / "frames.html").as_uri()], capture_output=True, text=True, timeout=90)
    if not shot.exists():
        pytest.skip(f"chromium did not take a screenshot (exit {done.returncode}): {done.stderr[-300:]}")
    with Image.open(shot) as im:
        im = im.convert("RGB")
        return [{colour: count for count, colour in im.crop((k * FRAME_W, 0, (k + 1) * FRAME_W, FRAME_H))
                 .getcolors(maxcolors=1 << 20)} for k in range(len(FRAMES))]


def test_chromium_draws_the_culprit_in_the_diverging_colour(frames):
    red = rgb(DIVERGING)
    diverging, agrees = frames[0].get(red, 0), frames[1].get(red, 0)
    assert 0 < agrees < 1000  # the legends' "diverges" swatches only
    assert diverging > agrees + 500  # and the culprit's box, about 50×22 px


def test_chromium_follows_links_to_a_node_and_to_a_row(frames):
    plain, at_node, at_row = frames[0], frames[2], frames[3]
    assert plain.get(TARGET_NODE, 0) == 0 and plain.get(TARGET_ROW, 0) == 0
    # A row's link leads to its node: the browser marks it as the target (a blue outline).
    assert at_node.get(TARGET_NODE, 0) > 100
    # A node's link leads to its row: scrolled into the frame and highlighted as the target.
    assert at_row.get(TARGET_ROW, 0) > 1000


def test_chromium_sorts_the_table_by_graph_order(tmp_path):
    """The 'graph order' button's script, pressed as the page loads: the rows come out in A's order."""
    graph = engine.load(odd_model(tmp_path / "odd.onnx")).graph
    text = report_html(hand_report(graph), graph)
    assert text.count("</body>") == 1
    page = tmp_path / "pressed.html"
    page.write_text(text.replace("</body>", '<script>document.querySelectorAll("button")[1].click()</script></body>'),
                    encoding="utf-8")
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           f"--user-data-dir={tmp_path / 'profile'}", page.as_uri()],
                          capture_output=True, text=True, timeout=90)
    if done.returncode != 0 or "<tbody" not in done.stdout:
        pytest.skip(f"chromium did not dump the page (exit {done.returncode}): {done.stderr[-300:]}")
    before = [int(k) for k in re.findall(r'data-order="(\d+)"', text)]
    after = [int(k) for k in re.findall(r'data-order="(\d+)"', done.stdout)]
    assert before != sorted(before) and after == sorted(before)
