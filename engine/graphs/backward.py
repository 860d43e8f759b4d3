"""The backward graph of a Gradient selection: what reverse mode runs, drawn as a graph.

For a validated (y, xs, zs) the *active slice* is every forward node on some path from a member
of xs to y inside the cut graph (cut at xs ∪ zs). Reversing it gives, top to bottom:

    seed dy --> one backward node per active forward node (its VJP) --> dx outputs

A tensor read by several active consumers gets an accumulation node: each consumer's VJP sends
its *partial* gradient there and the sum flows on. Members of xs ∪ zs computed by a node are cut
points: the backward graph stops there even though the model computes them from upstream.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..gradient.selection import GradientSpec
from ..modelfile.index import GraphIndex
from ..run.pacing import paced
from ..run.plan import needed_nodes
from .vjp_needs import vjp_needs

SEED_ID = "seed"


@dataclass(frozen=True)
class BackwardNode:
    """One node of the backward graph. `kind`: seed, backward, accumulate or dx."""

    id: str
    kind: str
    label: str
    tensor: str | None = None  # seed: y; accumulate: the fanned-out tensor; dx: the member of xs
    node_index: int | None = None  # backward: the forward node it reverses
    op_type: str | None = None
    sends_to: tuple[str, ...] = ()  # backward: forward inputs that receive gradient from it
    needs: tuple[str, ...] = ()  # backward: forward values its VJP reads besides the incoming gradient
    disconnected: bool = False  # dx: y does not depend on this member of xs (its gradient is zero)


@dataclass(frozen=True)
class BackwardEdge:
    """Gradient flowing from `source` to `target`, with respect to forward tensor `tensor`.

    `partial`: the contribution of one consumer of a fanned-out tensor (into its accumulation
    node); otherwise the tensor's whole gradient dy/d(tensor).
    """

    source: str
    target: str
    tensor: str
    partial: bool = False

    @property
    def key(self) -> str:
        return f"{self.source}->{self.target}"


@dataclass(frozen=True)
class BackwardGraph:
    spec: GradientSpec
    active_nodes: tuple[int, ...]  # forward node indices, topological order
    active_tensors: frozenset[str]  # tensors that depend on some x and that y depends on
    cut_nodes: tuple[int, ...]  # every forward node the cut graph runs (active or not)
    cuts: tuple[str, ...]  # members of xs ∪ zs that the model computes: the graph is cut there
    nodes: tuple[BackwardNode, ...]  # seed first, then reverse topological order, dx last
    edges: tuple[BackwardEdge, ...]

    def node(self, node_id: str) -> BackwardNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def edges_into(self, node_id: str) -> tuple[BackwardEdge, ...]:
        return tuple(e for e in self.edges if e.target == node_id)

    def edges_from(self, node_id: str) -> tuple[BackwardEdge, ...]:
        return tuple(e for e in self.edges if e.source == node_id)

    @property
    def accumulations(self) -> tuple[BackwardNode, ...]:
        return tuple(n for n in self.nodes if n.kind == "accumulate")

    def backward_node_of(self, node_index: int) -> BackwardNode | None:
        for n in self.nodes:
            if n.kind == "backward" and n.node_index == node_index:
                return n
        return None


def backward_id(node_index: int) -> str:
    return f"b{node_index}"


def accumulate_id(tensor: str) -> str:
    return f"acc:{tensor}"


def dx_id(tensor: str) -> str:
    return f"dx:{tensor}"


def graph_of(model) -> GraphIndex:
    """Accept a Model or a GraphIndex."""
    if isinstance(model, GraphIndex):
        return model
    graph = getattr(model, "graph", None)
    if isinstance(graph, GraphIndex):
        return graph
    raise TypeError(f"expected an engine Model or GraphIndex, got {type(model).__name__}")


def build_backward_graph(model, spec: GradientSpec) -> BackwardGraph:
    """The backward graph of a validated selection (see the module docstring)."""
    graph = graph_of(model)
    cut_nodes, _ = needed_nodes(graph, set(spec.inputs), [spec.y])
    # Each node's names read once: every protobuf field access builds a fresh container, and on a
    # 10,000-node model those accesses would be most of the time this takes.
    ins = {i: tuple(graph.nodes[i].input) for i in cut_nodes}
    outs = {i: tuple(graph.nodes[i].output) for i in cut_nodes}
    active_tensors, active_nodes = _active_slice(spec, cut_nodes, ins, outs)
    nodes, edges = _reversed(graph, spec, active_tensors, active_nodes, ins, outs)
    cuts = tuple(m for m in spec.inputs if m in graph.producer)
    return BackwardGraph(spec=spec, active_nodes=active_nodes, active_tensors=active_tensors,
                         cut_nodes=tuple(cut_nodes), cuts=cuts, nodes=tuple(nodes), edges=tuple(edges))


def _active_slice(spec: GradientSpec, cut_nodes, ins: dict, outs: dict) -> tuple[frozenset[str], tuple[int, ...]]:
    """(active tensors, active nodes): what depends on a connected member of xs and what y depends on."""
    from_x = {x for x in spec.xs if x not in spec.disconnected}
    for i in paced(cut_nodes):
        if any(t in from_x for t in ins[i] if t):
            from_x.update(t for t in outs[i] if t)
    to_y = {spec.y}
    for i in paced(reversed(cut_nodes)):
        if any(t in to_y for t in outs[i] if t):
            to_y.update(t for t in ins[i] if t)
    active_tensors = frozenset(from_x & to_y)
    active_nodes = tuple(
        i for i in cut_nodes
        if any(t in active_tensors for t in ins[i] if t)
        and any(t in active_tensors for t in outs[i] if t)
    )
    return active_tensors, active_nodes


def _reversed(graph: GraphIndex, spec: GradientSpec, active_tensors: frozenset[str], active_nodes: tuple[int, ...],
              ins: dict, outs: dict) -> tuple[list[BackwardNode], list[BackwardEdge]]:
    """The backward nodes and edges: the seed, a VJP per active node in reverse order with the
    accumulations its outputs need, then the dx outputs."""
    consumers: dict[str, list[int]] = {}
    for i in active_nodes:
        for t in dict.fromkeys(ins[i]):
            if t in active_tensors:
                consumers.setdefault(t, []).append(i)

    def gradient_target(t: str) -> str:
        if t in spec.xs:
            return dx_id(t)
        return backward_id(graph.producer[t])

    dy = f"d{spec.y}" if spec.y.isalnum() else f"d({spec.y})"
    nodes: list[BackwardNode] = [BackwardNode(SEED_ID, "seed", dy, tensor=spec.y)]
    edges: list[BackwardEdge] = []
    if spec.y in active_tensors:
        edges.append(BackwardEdge(SEED_ID, gradient_target(spec.y), spec.y))

    def fan_in(t: str) -> None:
        """Edges carrying t's gradient from its consumers' VJPs (via an accumulation node at fan-out)."""
        users = consumers.get(t, [])
        if len(users) > 1:
            acc = accumulate_id(t)
            nodes.append(BackwardNode(acc, "accumulate", f"Σ d{t}", tensor=t))
            edges.extend(BackwardEdge(backward_id(c), acc, t, partial=True) for c in users)
            edges.append(BackwardEdge(acc, gradient_target(t), t))
        elif users:
            edges.append(BackwardEdge(backward_id(users[0]), gradient_target(t), t))

    for i in paced(reversed(active_nodes), 128):
        for t in outs[i]:
            if t in active_tensors and t != spec.y:
                fan_in(t)
        sends_to = tuple(t for t in dict.fromkeys(ins[i]) if t in active_tensors)
        op_type = graph.nodes[i].op_type
        nodes.append(BackwardNode(
            backward_id(i), "backward", f"∂{op_type}", node_index=i, op_type=op_type,
            sends_to=sends_to, needs=vjp_needs(op_type, ins[i], outs[i]),
        ))
    for x in spec.xs:
        if x in active_tensors and x != spec.y:
            fan_in(x)
    for x in spec.xs:
        nodes.append(BackwardNode(dx_id(x), "dx", f"{dy}/d{x}", tensor=x,
                                  disconnected=x not in active_tensors))
    return nodes, edges
