"""The true size of a past key/value's symbolic head dims (genai's `kv_cache_dim`), read from the
model itself: the attention node that reads the past (its num_heads / kv_num_heads and the width
of its query), a Concat that joins the past to the current keys, or a declared output shape.

A made-up past of head size 1 is refused by onnxruntime and turns an engine run into nonsense, so
these sizes are never guessed: a dim none of these give is left to the caller.
"""
from __future__ import annotations

from typing import Iterator

from onnx import helper

from ..modelfile.index import GraphIndex, node_inputs

# Ops a past tensor passes through unchanged in shape on its way to the attention that reads it.
SHAPE_KEEPING = frozenset({"Identity", "Cast"})
MS = "com.microsoft"


def consumers_through(graph: GraphIndex, name: str, passing) -> Iterator[tuple[str, int]]:
    """(tensor, node index) for each node reading `name`, or what ops in `passing` make of it (read
    as their first input), each tensor once."""
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for i in graph.consumers.get(t, []):
            node = graph.nodes[i]
            if node.op_type in passing and node_inputs(node)[:1] == [t]:
                stack.extend(o for o in node.output if o)
            else:
                yield t, i


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def last_width(graph: GraphIndex, name: str, depth: int = 4) -> int | None:
    """The size of `name`'s last axis: declared, else the width of the projection computing it
    (a MatMul's or Gemm's weight, MatMulNBits' N, through an Add of a bias)."""
    info = graph.types.get(name)
    if info is not None and info.shape and isinstance(info.shape[-1], int) and info.shape[-1] > 0:
        return info.shape[-1]
    if depth == 0 or name not in graph.producer:
        return None
    node = graph.nodes[graph.producer[name]]
    ins, attrs = node_inputs(node), _attrs(node)
    if node.op_type == "MatMulNBits" and int(attrs.get("N", 0)) > 0:
        return int(attrs["N"])
    if node.op_type in ("MatMul", "Gemm") and len(ins) > 1 and ins[1] in graph.initializers:
        shape = graph.types[ins[1]].shape or ()
        axis = 0 if node.op_type == "Gemm" and attrs.get("transB", 0) else -1
        return int(shape[axis]) if shape else None
    if node.op_type in ("Add", "Identity", "Cast") and ins:
        return next((w for w in (last_width(graph, i, depth - 1) for i in ins) if w), None)
    return None


def _attention_sizes(graph: GraphIndex, i: int, slot: int) -> tuple[dict[int, int], str] | None:
    """{axis: size} a past input of attention node `i` must have (BNSH layout), and the source."""
    node = graph.nodes[i]
    ins, attrs = list(node.input), _attrs(node)
    heads = int(attrs.get("num_heads", 0))
    if node.op_type == "GroupQueryAttention" and slot in (3, 4) and heads > 0:
        kv = int(attrs.get("kv_num_heads", 0)) or heads
        packed = len(ins) < 2 or not ins[1]
        width = last_width(graph, ins[0]) if ins and ins[0] else None
        head = width // (heads + 2 * kv) if packed and width else width // heads if width else None
        if head is None and len(ins) > 7 and ins[7] and attrs.get("do_rotary"):
            cos = graph.types.get(ins[7])  # (max positions, rotary dim / 2): the rotary dim is the head size
            head = 2 * cos.shape[1] if cos and cos.shape and isinstance(cos.shape[-1], int) else None
        out = {1: kv}
        if head:
            out[3] = head
        return out, f"GroupQueryAttention {graph.node_names[i]!r} with num_heads={heads}, " \
                    f"kv_num_heads={kv}"
    if node.op_type == "MultiHeadAttention" and slot in (6, 7) and heads > 0:
        width = last_width(graph, ins[0]) if ins and ins[0] else None
        out = {1: heads}
        if width:
            out[3] = width // heads
        return out, f"MultiHeadAttention {graph.node_names[i]!r} with num_heads={heads}"
    return None


def head_sizes(graph: GraphIndex, past: str) -> tuple[dict[int, int], str]:
    """{axis: size} for the axes of past input `past` the model fixes, and where that was read
    ("" when nothing fixes them)."""
    rank = len(graph.types[past].shape or ())
    out: dict[int, int] = {}
    source = ""
    for t, i in consumers_through(graph, past, SHAPE_KEEPING):
        node = graph.nodes[i]
        if node.domain == MS and node.op_type in ("GroupQueryAttention", "MultiHeadAttention"):
            found = _attention_sizes(graph, i, list(node.input).index(t))
            if found:
                for axis, size in found[0].items():
                    out.setdefault(axis, size)
                source = source or found[1]
        elif node.op_type == "Concat":  # past joined to the current keys: the other axes agree
            axis = _attrs(node).get("axis", 0) % rank
            for other in [*node_inputs(node), *node.output]:
                shape = graph.types[other].shape if other in graph.types else None
                for a, d in enumerate(shape or ()):
                    if a != axis and isinstance(d, int) and d > 0 and len(shape) == rank:
                        out.setdefault(a, d)
                        source = source or f"Concat {graph.node_names[i]!r}"
    return out, source
