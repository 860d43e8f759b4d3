"""Forward mode written out as ONNX nodes: walk the cut forward graph from xs to y, tangents alongside.

The graph is cut at xs ∪ zs as for the gradient. A tensor carries a tangent when it is a float that
depends on some x; each node reading one gets its output tangents from its forward rule
(engine/lowering/jvp/registry.py), or else from its backward rule transposed: the backward rule's
nodes compute Jᵀu, linear in the cotangent u, so differentiating them with respect to u (the reverse
rules again, seeded with the input tangents) gives J·v exactly, with no finite difference. That serves
every op the gradient lowering covers, and an op with neither rule is refused in one line.
"""
from __future__ import annotations

from typing import Sequence

from onnx import NodeProto

from ...modelfile.index import node_inputs
from ..context import Ctx
from ..core import FLOATS, cut_slice, propagate, rule_for
from .registry import FORWARD


def tangent_pass(ctx: Ctx, nodes: Sequence[NodeProto], tangents: dict[str, str], members: set[str],
                 ys: Sequence[str]) -> dict[str, str]:
    """Add to ctx the nodes carrying `tangents` (x -> its tangent's name) forward through the nodes that
    compute ys from the members (xs ∪ zs); every tensor's tangent by name (zero where absent)."""
    known = dict(tangents)
    # a rule may read how an input was computed (SiLU's Mul looks for its Sigmoid): the forward nodes by output
    ctx.producers = {o: n for n in nodes for o in n.output if o}
    for node in cut_slice(nodes, ys, members):
        inputs = node_inputs(node)  # a subgraph's reads from this graph count as inputs, after the node's own
        ins = [known.get(t) if t else None for t in inputs]
        if all(t is None for t in ins) or not any(o and ctx.elem(o) in FLOATS for o in node.output):
            continue
        ctx.node = node
        fn = FORWARD.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        outs = fn(ctx, node, ins) if fn is not None else NotImplemented
        if outs is NotImplemented:
            outs = transposed(ctx, node, ins)
        for out, t in zip(node.output, outs):
            if out and t is not None and ctx.elem(out) in FLOATS:
                known[out] = t
                if out in ctx.types:
                    ctx.types[t] = ctx.types[out]
    ctx.node = None
    return known


def transposed(ctx: Ctx, node: NodeProto, ins: Sequence[str | None]) -> list[str | None]:
    """The node's output tangents from its backward rule: J·v = ∂⟨Jᵀu, v⟩/∂u, the backward nodes (built
    on a zero cotangent u per float output, whose value no derivative reads) differentiated w.r.t. u."""
    fn = rule_for(ctx, node)  # one line naming the op when it has no backward rule either
    cotangents = []
    for out in node.output:
        u = None
        if out and ctx.elem(out) in FLOATS:
            u = ctx.fill_like(out, 0.0)
            if out in ctx.types:
                ctx.types[u] = ctx.types[out]
        cotangents.append(u)
    us = [u for u in cotangents if u]
    outer = ctx.wanted
    ctx.wanted = tuple(t is not None for t in ins)
    start = len(ctx.nodes)
    grads = list(fn(ctx, node, cotangents) or [])
    backward_nodes = ctx.nodes[start:]
    ctx.infer(backward_nodes, [t for t in node_inputs(node) if t] + us)
    by_grad: dict[str, list[str]] = {}  # one backward tensor may be several inputs' gradient (Add's u)
    for g, t, want in zip(grads, ins, ctx.wanted):
        if g is not None and want and t is not None:
            by_grad.setdefault(g, []).append(t)
    ctx.wanted = outer
    seeds = {g: ctx.add_all(ts) for g, ts in by_grad.items()}
    found = iter(propagate(ctx, backward_nodes, seeds, us) if seeds else [None] * len(us))
    return [next(found) if u else None for u in cotangents]


def full(ctx: Ctx, t: str, like: str, *sources: str) -> str:
    """Tangent t, computed from the tangents of `sources`, broadcast to like's shape where no source has it
    (a tangent has its primal's shape exactly: y = a + b with b broadcast carries a's tangent at y's shape)."""
    shape_like = ctx.shape(like)
    if shape_like is not None and any(ctx.shape(s) == shape_like for s in sources):
        return t
    return ctx.op("Expand", [t, ctx.op("Shape", [like])])


def pruned(new: Sequence[NodeProto], kept: Sequence[NodeProto], outputs: Sequence[str]) -> list[NodeProto]:
    """The nodes of `new` that the graph outputs or `kept` nodes read, directly or not: a transposed rule
    builds its backward nodes on a zero cotangent and keeps only the part the tangent reads."""
    needed = set(outputs) | {t for n in kept for t in node_inputs(n)}
    out = []
    for n in reversed(new):  # rules add nodes after what they read
        if any(o in needed for o in n.output):
            out.append(n)
            needed.update(node_inputs(n))
    return out[::-1]
