"""Differentiate an op through a decomposition: nodes that recompute its outputs from its inputs out
of ops that have rules, differentiated in turn (the reverse pass then reads the recomputed values).

Two sources of decompositions: a rule that writes one (`through`, e.g. LSTM unrolled, a GroupNormalization
as reductions), and the ONNX function body of the op's schema (`function_rule`), which ONNX defines as
the op's meaning: it serves every op that has one and no hand-written rule (Attention, the losses,
RotaryEmbedding, ...).
"""
from __future__ import annotations

from typing import Callable, Sequence

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, helper

from .core import propagate


def through(ctx, node: NodeProto, grads: Sequence[str | None], build: Callable[[], Sequence[str | None]]) -> list:
    """Input gradients of `node` from a decomposition: `build()` adds the nodes recomputing the
    node's outputs from its inputs and returns their names (one per output, None where not rebuilt)."""
    start = len(ctx.nodes)
    rebuilt = list(build())
    decomposition = ctx.nodes[start:]
    ctx.infer(decomposition, [t for t in node.input if t])
    seeds = {new: g for new, g in zip(rebuilt, grads) if new and g is not None}
    wanted, seen = [], set()
    for i, t in enumerate(node.input):  # an input read twice gets its whole gradient once
        wanted.append(t if ctx.wants(i) and t not in seen else "")
        seen.add(t)
    targets = [t for t in wanted if t]
    found = dict(zip(targets, propagate(ctx, decomposition, seeds, targets)))
    return [found.get(t) if t else None for t in wanted]


def function_body(ctx, node: NodeProto) -> FunctionProto | None:
    """The op's ONNX function body at the model's opset, instantiated for this node's input types."""
    try:
        schema = onnx.defs.get_schema(node.op_type, ctx.opset, node.domain or "")
    except Exception:  # noqa: BLE001 - no schema: no body
        return None
    data = None
    if schema.has_context_dependent_function:
        types = []
        for t in node.input:
            info = ctx.types.get(t) if t else None
            shape = None if info is None else info.shape
            types.append(helper.make_tensor_type_proto(ctx.elem(t), shape).SerializeToString() if t
                         else onnx.TypeProto().SerializeToString())
        try:
            data = schema.get_context_dependent_function_with_opset_version(ctx.opset, node.SerializeToString(), types)
        except Exception:  # noqa: BLE001 - the builder refuses these attributes or types
            data = None
    elif schema.has_function:
        data = schema.get_function_with_opset_version(ctx.opset)
    if not data:
        return None
    body = FunctionProto()
    body.ParseFromString(data)
    return body


def _attribute_values(node: NodeProto, body: FunctionProto) -> dict[str, AttributeProto]:
    values = {a.name: a for a in body.attribute_proto}  # the body's own defaults
    try:
        schema = onnx.defs.get_schema(node.op_type, 10**4, node.domain or "")
        for name, a in schema.attributes.items():
            if a.default_value.type:
                values.setdefault(name, a.default_value)
    except Exception:  # noqa: BLE001 - defaults from the body only
        pass
    values.update({a.name: a for a in node.attribute})
    return values


def inline(ctx, node: NodeProto, body: FunctionProto) -> list[str]:
    """Add the body's nodes reading the node's inputs; the recomputed outputs' names."""
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        raise ctx.error("its function body holds subgraphs, which are not inlined")
    rename = {formal: actual for formal, actual in zip(body.input, list(node.input) + [""] * len(body.input))}
    values = _attribute_values(node, body)
    for n in body.node:
        copy = NodeProto()
        copy.CopyFrom(n)
        copy.input[:] = [rename.get(t, t) if t else "" for t in n.input]
        for k, t in enumerate(n.output):
            if t:
                rename[t] = ctx.fresh(f"{node.name or node.op_type}/{t}")
                copy.output[k] = rename[t]
        copy.name = ctx.fresh(f"{node.name or node.op_type}/{n.op_type}_node")
        kept = []
        for a in copy.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name not in values:
                    continue  # an optional attribute the node leaves unset
                resolved = AttributeProto()
                resolved.CopyFrom(values[a.ref_attr_name])
                resolved.name = a.name
                a = resolved
            kept.append(a)
        del copy.attribute[:]
        copy.attribute.extend(kept)
        ctx.nodes.append(copy)
    return [rename.get(t) for t in body.output]


def function_rule(ctx, node: NodeProto) -> Callable | None:
    """A rule differentiating `node` through its function body, or None when its schema has none."""
    body = function_body(ctx, node)
    if body is None:
        return None

    def rule(ctx, node, grads):
        return through(ctx, node, grads, lambda: inline(ctx, node, body))

    return rule
