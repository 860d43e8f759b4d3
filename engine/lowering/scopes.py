"""One name per tensor across the whole model, subgraphs included, before lowering.

ONNX lets sibling subgraphs reuse names (optimum's merged decoders: both branches of the If on
use_cache_branch define `/decoder/ConstantOfShape_2_output_0`, of different ranks). onnx's shape
inference with data propagation keys what it learns by name across subgraphs, so one branch's shape
data leaks into the other: the inferred model then holds types the full check refuses. Renaming each
subgraph's own names where another scope already has them makes the leak harmless; the main graph's
names (inputs, outputs, the selection) never change.
"""
from __future__ import annotations

import onnx

from ..modelfile.index import subgraphs
from .decompose import rename_refs


def unique_scopes(graph: onnx.GraphProto) -> None:
    """In place: every name a subgraph defines that another scope defines too gets a fresh name."""
    taken = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    taken |= {o for n in graph.node for o in n.output if o} | {o.name for o in graph.output}
    _own_nested(graph, taken)


def _own_nested(graph: onnx.GraphProto, taken: set[str]) -> None:
    for node in graph.node:
        for sub in subgraphs(node):
            _own(sub, taken, node.name or node.op_type)


def _own(graph: onnx.GraphProto, taken: set[str], owner: str) -> None:
    defined = [i.name for i in graph.input] + [t.name for t in graph.initializer]
    defined += [o for n in graph.node for o in n.output if o]
    rename = {}
    for name in defined:
        if name in taken and name not in rename:
            rename[name] = _fresh(f"{owner}/{graph.name}/{name}", taken)
        taken.add(name)
    if rename:
        _apply(graph, rename)
    _own_nested(graph, taken)


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _apply(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        vi.name = rename.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = rename.get(t.name, t.name)
    for n in graph.node:
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename.get(t, t) for t in n.output]
        for sub in subgraphs(n):  # a nested body reads the renamed names from this scope
            rename_refs(sub, rename)
