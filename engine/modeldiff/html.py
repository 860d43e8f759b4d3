"""The diff report as one self-contained HTML file: a header naming the culprit, A's graph as inline SVG
with nodes coloured by local error over tolerance (forward and gradient), the per-node table, the
unmatched tensors. Nothing outside the file is referenced, so it opens anywhere and works as a CI
artifact; `DiffReport._repr_html_` shows the same inline in Jupyter.

Placement is the engine's own layered layout (engine/graphs/layered.py), so no Graphviz is needed.
Graphs over MAX_DRAWN nodes are drawn only around the culprit, which keeps the file small.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from html import escape

from ..graphs.layered import place
from .report import FORWARD, GRADIENT, DiffReport, NodeDiff

MAX_DRAWN = 2000  # more nodes than this: draw the culprit's neighbourhood only
NEIGHBOURHOOD = 300  # nodes drawn around the culprit of a big graph
MAX_ROWS = 5000  # table rows kept, worst first
DIVERGING = "#d62728"  # local error beyond tolerance: the one colour the eye (and the browser test) looks for
NOT_COMPARED = "#c8c8c8"
CALM, ALERT = (0xd9, 0xf0, 0xd3), (0xff, 0xc1, 0x4d)  # ratio 1e-4 → 1 on a log scale
CELL, BOX_H, RANK_H, PAD = 7.0, 22.0, 56.0, 12.0  # pixels per layout cell, box height, rank pitch, margin
MAX_LABEL = 24
PREFIX = {FORWARD: "fwd", GRADIENT: "grad"}


def ratio(row: NodeDiff) -> float:
    """Local error in units of tolerance: > 1 diverges. NaN counts as diverging."""
    if math.isnan(row.local_error):
        return math.inf
    if row.tolerance > 0:
        return row.local_error / row.tolerance
    return math.inf if row.local_error > 0 else 0.0


def divergence_colour(row: NodeDiff | None) -> str:
    """Grey when not compared, the diverging red beyond tolerance, else pale green to amber (log scale)."""
    if row is None:
        return NOT_COMPARED
    r = ratio(row)
    if row.diverges or r > 1:
        return DIVERGING
    t = 0.0 if r <= 0 else min(1.0, max(0.0, (math.log10(r) + 4) / 4))
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(CALM, ALERT))


def graph_edges(graph) -> tuple[tuple[str, str], ...]:
    """A's node → node edges by display name: what DiffReport.edges holds so a report can draw itself."""
    edges: dict[tuple[str, str], None] = {}
    for i, node in enumerate(graph.nodes):
        for t in node.input:
            p = graph.producer.get(t)
            if t and p is not None and p != i:
                edges[(graph.node_names[p], graph.node_names[i])] = None
    return tuple(edges)


def report_html(report: DiffReport, graph=None) -> str:
    """The whole report as one HTML document; `graph` (A's GraphIndex) gives every node, the compared and
    the rest; without it the report's rows and `edges` are drawn."""
    title = escape(f"onnxgrad diff: {report.a} vs {report.b}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>\n'
            f"<style>{_CSS}</style></head><body>\n{report_body(report, graph)}\n</body></html>\n")


def report_fragment(report: DiffReport, graph=None) -> str:
    """The report as one <div> for a page that holds other things (Jupyter): its styles scoped to it, its
    ids made unique to it, so two reports in one notebook link each within itself."""
    prefix = f"onnxgrad-diff-{next(_fragments)}-"
    body = report_body(report, graph).replace(' id="', f' id="{prefix}').replace(' href="#', f' href="#{prefix}')
    return f"<style>{_CSS}</style>\n{body}"


_fragments = itertools.count(1)


def report_body(report: DiffReport, graph=None) -> str:
    """The report's <div>: every id and link in it is one we write (names are escaped, quotes included)."""
    names, ops, edges = _graph_of(report, graph)
    drawn, note = _drawn_nodes(report, names, edges)
    if graph is None and not report.edges and len(names) > 1:  # unconnected, they would stand in one long row
        drawn, note = [], "The graph is not drawn: this report carries no edges (render it with A's graph)."
    kept = report.worst()[:MAX_ROWS]
    rows = {(n.node, n.where): n for n in report.nodes}
    linked = {(n.node, n.where) for n in kept}
    wheres = [w for w in (FORWARD, GRADIENT) if any(n.where == w for n in report.nodes)] or [FORWARD]
    ids = {name: k for k, name in enumerate(names)}
    parts = ['<div class="onnxgrad-diff">', _header(report)]
    parts.append('<nav class="where">' + " ".join(
        f'<a href="#graph-{PREFIX[w]}">{w} graph</a>' for w in wheres) + ' <a href="#nodes">table</a>'
        ' <a href="#unmatched">unmatched</a></nav>')
    if note:
        parts.append(f'<p class="note">{escape(note)}</p>')
    layout = _layout(drawn, names, edges) if drawn else None
    for where in wheres:
        parts.append(_svg(where, layout, names, ops, ids, rows, linked, report))
    parts.append(_table(report, kept, ids, set(drawn), names))
    parts.append(_unmatched(report))
    parts.append(_SCRIPT + "</div>")
    return "\n".join(parts)


def _graph_of(report: DiffReport, graph):
    if graph is not None:
        names = list(graph.node_names)
        ops = {name: node.op_type for name, node in zip(names, graph.nodes)}
        return names, ops, list(graph_edges(graph))
    names, ops = [], {}
    for row in sorted(report.nodes, key=lambda n: (n.where != FORWARD, n.order if n.where == FORWARD else -n.order)):
        if row.node not in ops:
            names.append(row.node)
            ops[row.node] = row.op_type
    for a, b in report.edges:
        for name in (a, b):
            if name not in ops:
                names.append(name)
                ops[name] = ""
    return names, ops, list(report.edges)


def _drawn_nodes(report: DiffReport, names: list[str], edges) -> tuple[list[str], str]:
    if len(names) <= MAX_DRAWN:
        return names, ""
    first = report.first_divergence
    worst = report.worst()
    centre = first.node if first else (worst[0].node if worst else names[0])
    around: dict[str, list[str]] = {}
    for a, b in edges:
        around.setdefault(a, []).append(b)
        around.setdefault(b, []).append(a)
    seen, queue = {centre: None}, deque([centre])
    while queue and len(seen) < NEIGHBOURHOOD:
        for nb in around.get(queue.popleft(), ()):
            if nb not in seen and len(seen) < NEIGHBOURHOOD:
                seen[nb] = None
                queue.append(nb)
    drawn = [n for n in names if n in seen]
    return drawn, (f"The graph has {len(names):,} nodes: drawn are the {len(drawn)} nearest to "
                   f"'{centre}'; the table lists every compared node.")


def _layout(drawn: list[str], names: list[str], edges):
    index = {name: k for k, name in enumerate(drawn)}
    pairs = [(index[a], index[b]) for a, b in edges if a in index and b in index]
    widths = [min(len(n), MAX_LABEL) + 2 for n in drawn]
    placed = place(widths, pairs)
    left = min((c - w / 2 for c, w in zip(placed.centre, widths)), default=0.0)
    boxes = {}
    for k, name in enumerate(drawn):
        w = widths[k] * CELL
        x = (placed.centre[k] - left) * CELL - w / 2 + PAD
        boxes[name] = (x, placed.rank[k] * RANK_H + PAD, w)
    lines = []
    for e, (s, t) in enumerate(pairs):
        xs, ys, _ = boxes[drawn[s]]
        xt, yt, _ = boxes[drawn[t]]
        points = [(xs + boxes[drawn[s]][2] / 2, ys + BOX_H)]
        for j, cx in enumerate(placed.chains.get(e, ())):
            points.append(((cx - left) * CELL + PAD, (placed.rank[s] + 1 + j) * RANK_H + PAD + BOX_H / 2))
        points.append((xt + boxes[drawn[t]][2] / 2, yt))
        lines.append(points)
    width = max((x + w for x, _, w in boxes.values()), default=0) + PAD
    height = max((y for _, y, _ in boxes.values()), default=0) + BOX_H + PAD
    return boxes, lines, width, height


def _svg(where: str, layout, names, ops, ids, rows, linked, report: DiffReport) -> str:
    p = PREFIX[where]
    head = f'<section id="graph-{p}" class="graph"><h2>{where.capitalize()}: local error / tolerance</h2>'
    if layout is None:
        return head + '<p class="note">No nodes to draw.</p></section>'
    boxes, lines, width, height = layout
    first = report.first_divergence
    culprits = {c.node for c in report.culprits if c.where == where}
    out = [head, f'<svg width="{width:.0f}" height="{height:.0f}" '
                 f'viewBox="0 0 {width:.0f} {height:.0f}" role="img">',
           '<g class="edges">']
    for pts in lines:
        out.append('<polyline points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
    out.append("</g>")
    for name, (x, y, w) in boxes.items():
        row = rows.get((name, where))
        k = ids[name]
        label = name if len(name) <= MAX_LABEL else "…" + name[1 - MAX_LABEL:]  # exporters' paths end in the op
        tip = f"{name} ({ops.get(name) or '?'})"
        if row is not None:
            tip += f"\nlocal error {_fmt(row.local_error)}, tolerance {_fmt(row.tolerance)}"
        cls = "node culprit" if name in culprits or (first and first.node == name and first.where == where) else "node"
        shape = (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H:.0f}" rx="4" '
                 f'fill="{divergence_colour(row)}"/>'
                 f'<text x="{x + w / 2:.1f}" y="{y + 15:.1f}">{escape(label)}</text>'
                 f'<title>{escape(tip)}</title>')
        if (name, where) not in linked:
            out.append(f'<g id="{p}-node-{k}" class="{cls} off">{shape}</g>')
        else:
            out.append(f'<a id="{p}-node-{k}" class="{cls}" href="#row-{p}-{k}">{shape}</a>')
    out.append("</svg>")
    out.append(_legend())
    out.append("</section>")
    return "\n".join(out)


def _legend() -> str:
    stops = [("not compared", NOT_COMPARED)] + [
        (f"≤ {r:g}×tol", divergence_colour(NodeDiff("", "", FORWARD, 0, local_error=r, tolerance=1.0)))
        for r in (1e-4, 1e-2, 1.0)] + [("diverges", DIVERGING)]
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{c}"></i>{escape(t)}</span>' for t, c in stops) + "</p>"


def _header(report: DiffReport) -> str:
    first = report.first_divergence
    out = [f'<h1>onnxgrad diff</h1><p class="sides"><b>A</b> {escape(report.a)} &nbsp; <b>B</b> '
           f'{escape(report.b)} &nbsp; <b>mode</b> {escape(report.mode)}'
           + (f" &nbsp; <b>y</b> {escape(report.y)}" if report.y else "") + "</p>"]
    if first is None:
        out.append('<p class="verdict ok">No node diverges beyond tolerance.</p>')
    else:
        out.append(f'<p class="verdict bad">Diverges: first at node <b>{escape(first.node)}</b>'
                   f'{" (" + escape(first.op_type) + ")" if first.op_type else ""} in the {escape(first.where)}: '
                   f'local error {_fmt(first.error)} &gt; tolerance {_fmt(first.tolerance)}'
                   + (f" — {escape(first.note)}" if first.note else "") + "</p>")
    if len(report.culprits) > 1:
        out.append("<p>Where branches part independently:</p><ul>" + "".join(
            f"<li>{escape(c.where)}: <b>{escape(c.node)}</b> local error {_fmt(c.error)} "
            f"(tolerance {_fmt(c.tolerance)}){' — ' + escape(c.note) if c.note else ''}</li>"
            for c in report.culprits) + "</ul>")
    out.append(f"<p>{len(report.nodes)} rows compared, {report.matched_tensors} tensors matched, "
               f"{len(report.unmatched)} unmatched, {report.elapsed_s:.2f} s.</p>")
    out += [f'<p class="note">{escape(n)}</p>' for n in report.notes]
    return "\n".join(out)


def _table(report: DiffReport, rows: list[NodeDiff], ids, drawn: set[str], names) -> str:
    cut = len(report.nodes) - len(rows)
    graph_order = {name: k for k, name in enumerate(names)}
    out = ['<section id="nodes"><h2>Nodes</h2><p>Sort: <button type="button" onclick="onnxgradSortRows(this, \'worst\')">'
           'worst first</button> <button type="button" onclick="onnxgradSortRows(this, \'order\')">graph order</button></p>',
           '<table><thead><tr><th>where</th><th>node</th><th>op</th><th>error</th><th>local error</th>'
           '<th>tolerance</th><th>local / tol</th><th>inputs\' errors</th><th>B nodes</th><th>note</th></tr>'
           '</thead><tbody class="rows">']
    for rank, row in enumerate(rows):
        p = PREFIX.get(row.where, "fwd")
        k = ids.get(row.node)
        name = escape(row.node)
        cell = f'<a href="#{p}-node-{k}">{name}</a>' if k is not None and row.node in drawn else name
        order = graph_order.get(row.node, len(names)) * 2 + (row.where != FORWARD)
        row_id = f' id="row-{p}-{k}"' if k is not None else ""
        inputs = ", ".join(f"{escape(t)}: {_fmt(e)}" for t, e in row.input_errors)
        out.append(
            f'<tr{row_id} data-worst="{rank}" data-order="{order}" class="{"bad" if row.diverges else ""}">'
            f"<td>{escape(row.where)}</td><td>{cell}</td><td>{escape(row.op_type)}</td>"
            f"<td>{_fmt(row.error)}</td><td>{_fmt(row.local_error)}</td><td>{_fmt(row.tolerance)}</td>"
            f'<td><i class="swatch" style="background:{divergence_colour(row)}"></i>{_fmt(ratio(row))}</td>'
            f"<td>{inputs}</td><td>{escape(', '.join(row.b_nodes))}</td><td>{escape(row.note)}</td></tr>")
    out.append("</tbody></table>")
    if cut > 0:
        out.append(f'<p class="note">{cut:,} rows within tolerance left out; the JSON report has them all.</p>')
    return "\n".join(out) + "</section>"


def _unmatched(report: DiffReport) -> str:
    if not report.unmatched:
        return '<section id="unmatched"><h2>Unmatched tensors</h2><p>None: every tensor was matched.</p></section>'
    body = "".join(f"<tr><td>{escape(u.side.upper())}</td><td>{escape(u.tensor)}</td><td>{escape(u.producer)}</td>"
                   f"<td>{escape(u.why)}</td></tr>" for u in report.unmatched)
    return ('<section id="unmatched"><h2>Unmatched tensors</h2><table><thead><tr><th>side</th><th>tensor</th>'
            f"<th>producer</th><th>why</th></tr></thead><tbody>{body}</tbody></table></section>")


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"


_CSS = """
.onnxgrad-diff { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
.onnxgrad-diff .verdict { font-size: 1.15em; padding: .4em .7em; border-radius: 4px; }
.onnxgrad-diff .verdict.ok { background: #d9f0d3; } .onnxgrad-diff .verdict.bad { background: #f8d0d0; }
.onnxgrad-diff .note { color: #555; font-style: italic; }
.onnxgrad-diff svg { display: block; max-width: none; border: 1px solid #ddd; margin: .5em 0; }
.onnxgrad-diff section.graph { overflow: auto; }
.onnxgrad-diff .edges polyline { fill: none; stroke: #888; stroke-width: 1.2; }
.onnxgrad-diff .node rect { stroke: #444; stroke-width: 1; }
.onnxgrad-diff .node.culprit rect { stroke: #000; stroke-width: 3; }
.onnxgrad-diff .node text { font: 11px monospace; text-anchor: middle; pointer-events: none; }
.onnxgrad-diff a.node:target rect, .onnxgrad-diff a.node:hover rect { stroke: #1f5fbf; stroke-width: 4; }
.onnxgrad-diff table { border-collapse: collapse; }
.onnxgrad-diff th, .onnxgrad-diff td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
.onnxgrad-diff tr.bad td { background: #fde8e8; } .onnxgrad-diff tr:target td { background: #fff3b0; }
.onnxgrad-diff i.swatch, .onnxgrad-diff .legend i { display: inline-block; width: 1em; height: 1em;
  margin-right: .3em; vertical-align: middle; border: 1px solid #888; }
.onnxgrad-diff .legend span { margin-right: 1em; }
"""

_SCRIPT = """<script>
function onnxgradSortRows(button, key) {
  var body = button.closest("section").querySelector("tbody.rows");
  var rows = Array.prototype.slice.call(body.rows);
  rows.sort(function (a, b) { return a.dataset[key] - b.dataset[key]; });
  rows.forEach(function (r) { body.appendChild(r); });
}
</script>"""
