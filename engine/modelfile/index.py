"""Load an ONNX model and index it: producers, consumers, topological order, declared types."""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
from onnx import ModelProto, NodeProto, TensorProto

from ..errors import ModelLoadError
from .domains import STANDARD_DOMAINS, TRAINING_DOMAIN  # noqa: F401  (engine.modelfile.index names them)

if TYPE_CHECKING:
    from .weights import Weights



@dataclass(frozen=True)
class TensorInfo:
    """What the model declares about a tensor: ONNX element type and shape (None / str for unknown dims)."""

    elem_type: int | None
    shape: tuple[int | str | None, ...] | None

    @property
    def is_float(self) -> bool:
        from .elements import FLOAT_ONNX_TYPES

        return self.elem_type in FLOAT_ONNX_TYPES


@dataclass
class GraphIndex:
    """A loaded graph with the lookups every other module needs. Treat as read-only."""

    model: ModelProto
    path: str | None
    opsets: dict[str, int]
    nodes: list[NodeProto]  # topological order
    node_names: list[str]  # unique, never empty
    producer: dict[str, int]  # tensor -> index into nodes
    consumers: dict[str, list[int]]
    inputs: list[str]  # graph inputs without an initializer: must be fed
    overridable: frozenset[str]  # initializers that are also graph inputs
    initializers: dict[str, TensorProto]
    outputs: list[str]
    types: dict[str, TensorInfo] = field(default_factory=dict)
    # Initializer values (engine/modelfile/weights.py): read on first use, zero-copy where the bytes allow.
    # `initializers` holds the protos without the bytes of any tensor of a kilobyte or more.
    weights: Weights | None = None
    # The model as it was read, without the weights and before shape inference added value_info:
    # what writing the model back starts from (with `weights`).
    source: ModelProto | None = None

    @property
    def name(self) -> str:
        return self.model.graph.name or (os.path.basename(self.path) if self.path else "model")

    def __repr__(self) -> str:
        # The dataclass repr would print the proto, every weight's bytes included (minutes at 650 MB).
        return (f"<GraphIndex {self.name!r}: {len(self.nodes)} nodes, {len(self.initializers)} initializers, "
                f"inputs {self.inputs}, outputs {self.outputs}>")

    def opset(self, domain: str) -> int:
        return self.opsets.get(domain or "", self.opsets.get("ai.onnx", 1))

    def has_tensor(self, name: str) -> bool:
        return name in self.producer or name in self.initializers or name in self.inputs

    def all_tensors(self) -> list[str]:
        seen: dict[str, None] = {}
        for name in list(self.inputs) + list(self.initializers):
            seen[name] = None
        for node in self.nodes:
            for t in node.output:
                if t:
                    seen[t] = None
        return list(seen)

    def did_you_mean(self, name: str) -> str:
        """' (did you mean 'A', 'B'?)' naming the closest tensor names, or '' when none is close."""
        import difflib

        names = self.all_tensors()
        same_case = [n for n in names if n.lower() == name.lower()]
        # cutoff 0.5, not difflib's 0.6: a one-character slip in a two-character name (W9 for W1) is 0.5
        close = difflib.get_close_matches(name, names, n=6, cutoff=0.5)
        close.sort(key=lambda n: (-difflib.SequenceMatcher(None, name, n).ratio(), n))
        close = (same_case + [n for n in close if n not in same_case])[:3]
        return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""

    def is_constant(self, name: str) -> bool:
        """An initializer that the user cannot feed at graph level (not also a graph input)."""
        return name in self.initializers


def _display_names(nodes: list[NodeProto]) -> list[str]:
    names, used = [], set()
    for i, node in enumerate(nodes):
        base = node.name or f"{node.op_type}_{i}"
        name, k = base, 1
        while name in used:
            k += 1
            name = f"{base}#{k}"
        used.add(name)
        names.append(name)
    return names


def subgraphs(node: NodeProto) -> list[onnx.GraphProto]:
    """The node's graph attributes (If's branches, Loop's and Scan's bodies), in attribute order."""
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def implicit_inputs(node: NodeProto) -> tuple[str, ...]:
    """Names the node's subgraphs (If, Loop, Scan bodies) read from the enclosing graph, first use first."""
    seen: dict[str, None] = {}
    for g in subgraphs(node):
        for name in graph_free_names(g):
            seen[name] = None
    return tuple(seen)


def graph_free_names(g: onnx.GraphProto) -> tuple[str, ...]:
    """Names a (sub)graph reads but neither declares nor computes: they come from an enclosing scope."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {t for n in g.node for t in n.output if t}
    free: dict[str, None] = {}
    for n in g.node:
        for t in node_inputs(n):
            if t and t not in defined:
                free[t] = None
    for o in g.output:
        if o.name not in defined:
            free[o.name] = None
    return tuple(free)


def node_inputs(node: NodeProto) -> list[str]:
    """The node's inputs, then the names its subgraphs read from the enclosing graph."""
    if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return list(node.input)
    return list(node.input) + [t for t in implicit_inputs(node) if t not in node.input]


def _toposort(nodes: list[NodeProto], available: set[str]) -> list[NodeProto]:
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    indegree = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for t in set(node_inputs(node)):
            if t and t in producer and t not in available:
                indegree[i] += 1
                users[producer[t]].append(i)
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    order = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in users[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i, d in enumerate(indegree) if d > 0)
        raise ModelLoadError(f"graph has a cycle through node {stuck.name or stuck.op_type!r}")
    return [nodes[i] for i in order]


def _declared_types(model: ModelProto) -> dict[str, TensorInfo]:
    out = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
            )
        out[vi.name] = TensorInfo(tt.elem_type or None, shape)
    for init in g.initializer:
        out[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    return out


def index(model: ModelProto, path: str | None = None) -> GraphIndex:
    g = model.graph
    opsets = {}
    for imp in model.opset_import:
        opsets[imp.domain or ""] = imp.version
    initializers = {t.name: t for t in g.initializer}
    declared_inputs = [i.name for i in g.input]
    inputs = [n for n in declared_inputs if n not in initializers]
    overridable = frozenset(n for n in declared_inputs if n in initializers)
    available = set(declared_inputs) | set(initializers)
    nodes = _toposort(list(g.node), available)
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for t in node.output:
            if not t:
                continue
            if t in producer or t in available:
                raise ModelLoadError(f"tensor {t!r} is produced more than once (node {node.name or node.op_type!r})")
            producer[t] = i
        for t in node_inputs(node):
            if t:
                consumers.setdefault(t, []).append(i)
    known = available | set(producer)
    for node in nodes:
        for t in node_inputs(node):
            if t and t not in known:
                raise ModelLoadError(
                    f"node {node.name or node.op_type!r} reads {t!r}, which no node, input or initializer provides"
                )
    for o in g.output:
        if o.name not in known:
            raise ModelLoadError(f"graph output {o.name!r} is never produced")
    return GraphIndex(
        model=model,
        path=path,
        opsets=opsets,
        nodes=nodes,
        node_names=_display_names(nodes),
        producer=producer,
        consumers=consumers,
        inputs=inputs,
        overridable=overridable,
        initializers=initializers,
        outputs=[o.name for o in g.output],
        types=_declared_types(model),
    )
