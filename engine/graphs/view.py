"""What a drawing shows: nodes with roles, edges with kinds, clusters — before any geometry.

DOT (dot.py) and the terminal layout (layout.py) draw the same ViewGraph, so the picture in the
explorer and the exported SVG agree on what is shown.

Views:
  forward   operators, plus tensor nodes for graph inputs/outputs, the selection's members and
            y (and every initializer in small models); off-slice operators dimmed; a cluster
            per Gradient node.
  backward  the selection's backward graph (one cluster per Gradient node when no selection is
            given and the model has Gradient nodes).
  combined  forward beside backward: each backward graph in a cluster with the forward values
            its VJPs read drawn as dotted "needs" edges, as the spec draws Gradient beside the
            graph it differentiates.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from onnx import helper

from ..errors import SelectionError
from ..gradient.selection import GradientSpec, validate
from ..modelfile.index import TRAINING_DOMAIN, GraphIndex
from ..run.pacing import paced
from .backward import BackwardGraph, build_backward_graph, graph_of

VIEWS = ("forward", "backward", "combined")
SMALL_MODEL_NODES = 64  # up to this many nodes, initializers get nodes and edges get tensor labels
ROLE_ORDER = ("y", "x", "z", "output", "input")


@dataclass(frozen=True)
class ViewNode:
    id: str
    label: str
    role: str  # x z y active inactive input output gradient backward accumulate seed dx
    op_type: str | None = None
    node_index: int | None = None
    cluster: str | None = None
    detail: str = ""  # a second line for DOT (torch autograd functions, node name)
    chain: tuple[str, ...] = ()  # ids of the nodes a collapsed chain stands for


@dataclass(frozen=True)
class ViewEdge:
    source: str
    target: str
    kind: str = "data"  # data, gradient_input, cut, grad, partial, needs, output
    tensor: str | None = None
    label: str = ""
    stats_key: str | None = None  # BackwardEdge.key, for gradient stats
    alert: bool = False  # its gradient has NaN or Inf entries


@dataclass(frozen=True)
class ViewGraph:
    view: str
    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    clusters: tuple[tuple[str, str], ...] = ()  # (cluster id, label)
    small: bool = True
    same_rank: tuple[tuple[str, ...], ...] = ()  # groups drawn on one row (each backward graph's dx)


def spec_label(spec: GradientSpec) -> str:
    zs = f", zs=[{', '.join(spec.zs)}]" if spec.zs else ""
    return f"Gradient(xs=[{', '.join(spec.xs)}]{zs}, y={spec.y})"


def gradient_nodes(graph: GraphIndex) -> list[tuple[int, GradientSpec]]:
    """The model's own Gradient nodes and their (validated) selections."""
    out = []
    for i, node in enumerate(graph.nodes):
        if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            xs = [v.decode() for v in attrs.get("xs", [])]
            zs = [v.decode() for v in attrs.get("zs", [])]
            out.append((i, validate(graph, attrs["y"].decode(), xs, zs, strict=True)))
    return out


def build_view(model, spec: GradientSpec | None = None, view: str = "forward", stats=None, *,
               collapse_chains: bool = False, needs_edges: bool = True, nodes=None) -> ViewGraph:
    """`nodes`: forward view only, the ids of the boxes to keep ("n<index>", "t:<tensor>") with the
    edges among them: a neighbourhood drawn without building the whole view (local.py)."""
    if view not in VIEWS:
        raise SelectionError(f"unknown view {view!r}: choose forward, backward or combined")
    graph = graph_of(model)
    small = len(graph.nodes) <= SMALL_MODEL_NODES
    if spec is not None and stats is not None and stats.backward.spec != spec:
        stats = None  # stats of another selection would label the wrong edges
    if spec is None and stats is not None:
        spec = stats.backward.spec
    only = nodes
    nodes: list[ViewNode] = []
    edges: list[ViewEdge] = []
    clusters: list[tuple[str, str]] = []
    if only is not None and view != "forward":
        raise SelectionError("only the forward view can be cut to some nodes")
    if view in ("forward", "combined"):
        backward = build_backward_graph(graph, spec) if spec is not None else None
        # Without a selection the combined view draws each Gradient node inside its backward cluster.
        own_cluster = not (view == "combined" and spec is None)
        _forward(graph, spec, backward, small, own_cluster, nodes, edges, clusters, only)
    if view in ("backward", "combined"):
        if spec is not None:
            targets = [("bw", None, build_backward_graph(graph, spec), stats)]
        else:
            targets = [(f"g{i}", i, build_backward_graph(graph, s), None) for i, s in gradient_nodes(graph)]
            if not targets:
                raise SelectionError(f"the {view} view needs a selection: give y and xs")
        for prefix, grad_index, backward, run_stats in targets:
            cluster = f"cluster_{prefix}"
            label = spec_label(backward.spec)
            if grad_index is not None:
                label = f"{graph.node_names[grad_index]}: {label}"
            clusters.append((cluster, label))
            _backward(graph, backward, run_stats, prefix, cluster, grad_index, view == "combined",
                      needs_edges, small, nodes, edges)
    same_rank = tuple(group for group in (
        tuple(n.id for n in nodes if n.role == "dx" and n.cluster == c) for c, _ in clusters) if len(group) > 1)
    result = ViewGraph(view, tuple(nodes), tuple(_dedupe(edges)), tuple(clusters), small, same_rank)
    return collapse(result) if collapse_chains else result


def _dedupe(edges):
    seen = set()
    for e in edges:
        key = (e.source, e.target, e.tensor, e.kind)
        if key not in seen:
            seen.add(key)
            yield e


def _tensor_roles(graph: GraphIndex, spec: GradientSpec | None, small: bool) -> dict[str, str]:
    roles: dict[str, str] = {}

    def give(name, role):
        if name not in roles or ROLE_ORDER.index(role) < ROLE_ORDER.index(roles[name]):
            roles[name] = role

    for t in graph.inputs:
        give(t, "input")
    if small:
        for t in graph.initializers:
            if t in graph.consumers:
                give(t, "input")
    for t in graph.outputs:
        give(t, "output")
    if spec is not None:
        for t in spec.zs:
            give(t, "z")
        for t in spec.xs:
            give(t, "x")
        give(spec.y, "y")
    return roles


def _forward(graph, spec, backward, small, own_cluster, nodes, edges, clusters, only=None) -> None:
    roles = _tensor_roles(graph, spec, small)
    active = set(backward.active_nodes) if backward is not None else None
    members = set(spec.inputs) if spec is not None else set()
    indices = range(len(graph.nodes))
    shown_roles = roles
    if only is not None:
        indices = sorted(int(i[1:]) for i in only if i.startswith("n"))
        shown_roles = {t: r for t, r in roles.items() if f"t:{t}" in only}
    for t, role in shown_roles.items():
        nodes.append(ViewNode(f"t:{t}", t, role))
    for i in paced(indices):
        node = graph.nodes[i]
        name = graph.node_names[i]
        cluster = None
        if node.domain == TRAINING_DOMAIN and node.op_type == "Gradient":
            role = "gradient"
            if own_cluster:
                cluster = f"cluster_n{i}"
                clusters.append((cluster, name))
            else:
                cluster = f"cluster_g{i}"

        elif active is None or i in active:
            role = "active"
        else:
            role = "inactive"
        detail = name if node.name and node.name != node.op_type else ""
        nodes.append(ViewNode(f"n{i}", node.op_type, role, node.op_type, i, cluster, detail))
        # Inside a backward cluster a Gradient node's inputs must not rank it below the forward
        # graph, or the cluster would hang under it instead of standing beside it.
        kind = "data" if role != "gradient" or own_cluster else "gradient_input"
        for t in node.input:
            if t in roles:
                if t in shown_roles:
                    edges.append(ViewEdge(f"t:{t}", f"n{i}", kind, t))
            elif t in graph.producer and (only is None or f"n{graph.producer[t]}" in only):
                edges.append(ViewEdge(f"n{graph.producer[t]}", f"n{i}", kind, t, t if small else ""))
        for t in node.output:
            if t in shown_roles:
                edges.append(ViewEdge(f"n{i}", f"t:{t}", "cut" if t in members else "output", t))


def _backward(graph, backward: BackwardGraph, stats, prefix, cluster, grad_index, combined, needs_edges,
              small, nodes, edges) -> None:
    def vid(node_id: str) -> str:
        return f"{prefix}/{node_id}"

    grad_outputs = {}
    if grad_index is not None:
        node = graph.nodes[grad_index]
        grad_outputs = {x: out for x, out in zip(backward.spec.xs, node.output) if out}
    for n in backward.nodes:
        detail = ""
        label = n.label
        if n.kind == "backward" and stats is not None:
            detail = " ".join(stats.torch_functions.get(n.node_index, ()))
        if n.kind == "dx":
            if n.tensor in grad_outputs:
                detail = grad_outputs[n.tensor]
            if n.disconnected:
                detail = (detail + " " if detail else "") + "disconnected: 0"
        nodes.append(ViewNode(vid(n.id), label, n.kind, n.op_type, n.node_index, cluster, detail))
    for e in backward.edges:
        label, alert = f"d{e.tensor}", False
        if stats is not None:
            s = stats.edges.get(e.key)
            label += "\n" + (s.describe() if s is not None else "no gradient")
            alert = s is not None and not s.finite
        elif not small:
            label = ""
        edges.append(ViewEdge(vid(e.source), vid(e.target), "partial" if e.partial else "grad", e.tensor,
                              label, e.key, alert))
    if not combined:
        return
    if grad_index is not None:  # the dx outputs are what the Gradient node returns
        for n in backward.nodes:
            if n.kind == "dx" and n.tensor in grad_outputs:
                edges.append(ViewEdge(vid(n.id), f"n{grad_index}", "grad", n.tensor))
    if not needs_edges:
        return
    roles = _tensor_roles(graph, backward.spec, small)
    for n in backward.nodes:
        for t in n.needs:
            if t in roles:
                edges.append(ViewEdge(f"t:{t}", vid(n.id), "needs", t))
            elif t in graph.producer:
                edges.append(ViewEdge(f"n{graph.producer[t]}", vid(n.id), "needs", t))


def collapse(view: ViewGraph, min_length: int = 3) -> ViewGraph:
    """Fold maximal linear chains of operators (one operator in, one way out, same role and cluster)."""
    by_id = {n.id: n for n in view.nodes}
    foldable = {"active", "inactive", "backward"}
    flow = [e for e in view.edges if e.kind not in ("needs", "gradient_input")]
    outs: dict[str, set[str]] = {}
    ins: dict[str, set[str]] = {}  # from other operators only: a weight read on the way keeps a chain
    for e in flow:
        outs.setdefault(e.source, set()).add(e.target)
        if by_id[e.source].role in foldable or by_id[e.source].role == "gradient":
            ins.setdefault(e.target, set()).add(e.source)

    def link(a: str) -> str | None:
        """The next node of a chain after `a`, if the pair a -> b is a chain link."""
        targets = outs.get(a, ())
        if len(targets) != 1:
            return None
        (b,) = targets
        na, nb = by_id[a], by_id[b]
        if (nb.role != na.role or nb.cluster != na.cluster or na.role not in foldable
                or len(ins.get(b, ())) != 1):
            return None
        return b

    has_pred = {b for a in by_id if (b := link(a)) is not None}
    rename: dict[str, str] = {}
    replaced: dict[str, ViewNode] = {}
    for n in view.nodes:
        if n.id in has_pred or link(n.id) is None:
            continue
        chain = [n.id]
        while (nxt := link(chain[-1])) is not None:
            chain.append(nxt)
        if len(chain) < min_length:
            continue
        first, last = by_id[chain[0]], by_id[chain[-1]]
        label = f"{first.label} … {last.label} ×{len(chain)}"
        replaced[first.id] = replace(first, label=label, op_type="chain", detail="", chain=tuple(chain))
        for member in chain[1:]:
            rename[member] = first.id
    if not replaced:
        return view
    nodes = tuple(replaced.get(n.id, n) for n in view.nodes if n.id not in rename)
    same_rank = tuple(g for g in (tuple(i for i in group if i not in rename) for group in view.same_rank) if len(g) > 1)
    edges = []
    for e in view.edges:
        s, t = rename.get(e.source, e.source), rename.get(e.target, e.target)
        if s != t:
            edges.append(replace(e, source=s, target=t))
    return replace(view, nodes=nodes, edges=tuple(_dedupe(edges)), same_rank=same_rank)
