"""Reverse mode written out as ONNX nodes: walk the cut forward graph from y back to xs.

The graph is cut at xs ∪ zs: only nodes that compute y from those members count. A tensor is
*active* when it is a float that depends on some x and that y depends on; each active node's rule
turns the gradients of its outputs into gradients of its inputs, and a tensor read by several
active nodes sums their partial gradients. Members of xs that y does not reach get zeros.
"""
from __future__ import annotations

from typing import Sequence

from onnx import NodeProto, TensorProto

from ..modelfile.index import node_inputs
from .context import Ctx
from .registry import BACKWARD, REFUSED

FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def cut_slice(nodes: Sequence[NodeProto], ys: Sequence[str], members: set[str]) -> list[NodeProto]:
    """The nodes (in the given topological order) that compute ys from `members` and constants."""
    producer = {t: k for k, n in enumerate(nodes) for t in n.output if t}
    needed: set[int] = set()
    stack, seen = list(ys), set()
    while stack:
        t = stack.pop()
        if not t or t in seen or t in members:
            continue
        seen.add(t)
        k = producer.get(t)
        if k is not None and k not in needed:
            needed.add(k)
            stack.extend(node_inputs(nodes[k]))
    return [n for k, n in enumerate(nodes) if k in needed]


def active_tensors(ctx: Ctx, slice_: Sequence[NodeProto], ys: Sequence[str], xs: Sequence[str]) -> set[str]:
    from_x = set(xs)
    for n in slice_:
        if any(t in from_x for t in node_inputs(n) if t):
            from_x.update(t for t in n.output if t and ctx.elem(t) in FLOATS)
    to_y = set(ys)
    for n in reversed(slice_):
        if any(t in to_y for t in n.output if t):
            to_y.update(t for t in node_inputs(n) if t)
    return from_x & to_y


def propagate(ctx: Ctx, nodes: Sequence[NodeProto], seeds: dict[str, str], xs: Sequence[str],
              zs: Sequence[str] = ()) -> list[str | None]:
    """Add to ctx the nodes computing the gradient of each x given the gradients `seeds` of some
    tensors (None for an x no gradient reaches)."""
    outer = ctx.node, ctx.wanted  # a rule may differentiate its own decomposition
    slice_ = cut_slice(nodes, list(seeds), set(xs) | set(zs))
    active = active_tensors(ctx, slice_, list(seeds), xs)
    partials: dict[str, list[str]] = {t: [g] for t, g in seeds.items() if t in active}
    for node in reversed(slice_):
        if not any(t in active for t in node.output):
            continue
        grads = [ctx.add_all(partials.pop(t, [])) if t in active else None for t in node.output]
        if all(g is None for g in grads):
            continue
        ctx.node = node
        fn = rule_for(ctx, node)
        inputs = node_inputs(node)  # a subgraph's reads from this graph count as inputs, after the node's own
        ctx.wanted = tuple(bool(t) and t in active for t in inputs)
        in_grads = list(fn(ctx, node, grads) or [])
        for t, g, want in zip(inputs, in_grads, ctx.wanted):
            if g is not None and want:
                partials.setdefault(t, []).append(g)
    ctx.node, ctx.wanted = outer
    return [ctx.add_all(partials.get(x, [])) for x in xs]


def rule_for(ctx: Ctx, node: NodeProto):
    """The node's backward rule: its own, else its ONNX function body's; refusals say why not."""
    from .decompose import function_rule  # lazy cycle: a function body is differentiated by propagate, here

    standard = node.domain in ("", "ai.onnx")
    fn = BACKWARD.get(node.op_type) if standard else None
    if fn is not None:
        return fn
    if standard and node.op_type in REFUSED:
        raise ctx.error(REFUSED[node.op_type])
    fn = function_rule(ctx, node)
    if fn is None:
        raise ctx.error(f"no backward rule for {node.op_type} (rules exist for {', '.join(sorted(BACKWARD))})")
    return fn


def backward(ctx: Ctx, nodes: Sequence[NodeProto], y: str, xs: Sequence[str], zs: Sequence[str],
             seed: str | None) -> list[str]:
    """Add to ctx the nodes computing dy/dx for each x (seed: dy's name, None for ones); their names."""
    seed = seed if seed is not None else ctx.fill_like(y, 1.0)
    grads = propagate(ctx, nodes, {y: seed}, xs, zs)
    return [g if g is not None else ctx.fill_like(x, 0.0) for x, g in zip(xs, grads)]


def supported_ops() -> list[str]:
    return sorted(BACKWARD)
