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
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, helper, numpy_helper

from ..modelfile.index import node_inputs, subgraphs
from .core import propagate


def through(ctx, node: NodeProto, grads: Sequence[str | None], build: Callable[[], Sequence[str | None]]) -> list:
    """Input gradients of `node` from a decomposition: `build()` adds the nodes recomputing the
    node's outputs from its inputs and returns their names (one per output, None where not rebuilt)."""
    start = len(ctx.nodes)
    rebuilt = list(build())
    decomposition = ctx.nodes[start:]
    inputs = node_inputs(node)  # a body's reads from the enclosing graph too
    ctx.infer(decomposition, [t for t in inputs if t])
    seeds = {new: g for new, g in zip(rebuilt, grads) if new and g is not None}
    wanted, seen = [], set()
    for i, t in enumerate(inputs):  # an input read twice gets its whole gradient once
        wanted.append(t if ctx.wants(i) and t not in seen else "")
        seen.add(t)
    targets = [t for t in wanted if t]
    found = dict(zip(targets, propagate(ctx, decomposition, seeds, targets)))
    return [found.get(t) if t else None for t in wanted]


def _latest(versions, opset: int) -> int | None:
    return max((v for v in versions if v <= opset), default=None)


def function_body(ctx, node: NodeProto) -> FunctionProto | None:
    """The op's ONNX function body (the newest one at or below the model's opset), instantiated for
    this node's attributes and input types."""
    try:
        schema = onnx.defs.get_schema(node.op_type, ctx.opset, node.domain or "")
    except Exception:  # noqa: BLE001 - no schema: no body
        return None
    data = None
    if schema.has_context_dependent_function:
        version = _latest(schema.context_dependent_function_opset_versions, ctx.opset)
        types = [helper.make_tensor_type_proto(ctx.elem(t), _shape(ctx, t)).SerializeToString() if t
                 else onnx.TypeProto().SerializeToString() for t in node.input]
        try:
            data = schema.get_context_dependent_function_with_opset_version(version, node.SerializeToString(), types)
        except Exception:  # noqa: BLE001 - the builder refuses these attributes or types
            data = None
    elif schema.has_function:
        data = schema.get_function_with_opset_version(_latest(schema.function_opset_versions, ctx.opset))
    if not data:
        return None
    body = FunctionProto()
    body.ParseFromString(data)
    return body


def _shape(ctx, t):
    info = ctx.types.get(t)
    return None if info is None else info.shape


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


def _resolved(node: NodeProto, body: FunctionProto) -> list[NodeProto]:
    """The body's nodes with attribute references replaced by the node's values (or the defaults)."""
    values = _attribute_values(node, body)
    out = []
    for n in body.node:
        copy = NodeProto()
        copy.CopyFrom(n)
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
        out.append(copy)
    return out


def _at_opset(ctx, node: NodeProto, body: FunctionProto, nodes: list[NodeProto]) -> list[NodeProto]:
    """The body's nodes converted to the model's opset (a body written for an older one)."""
    version = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), ctx.opset)
    if version >= ctx.opset:
        return nodes
    present = [(formal, actual) for formal, actual in zip(body.input, node.input) if actual]
    inputs = [helper.make_tensor_value_info(formal, ctx.elem(actual), _shape(ctx, actual)) for formal, actual in present]
    produced = {t for n in nodes for t in n.output}
    outputs = [helper.make_tensor_value_info(t, 0, None) for t in body.output if t in produced]
    graph = helper.make_graph(nodes, "body", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)])
    try:
        return list(onnx.version_converter.convert_version(model, ctx.opset).graph.node)
    except Exception as exc:  # noqa: BLE001 - the converter's own refusal, in one line
        raise ctx.error(f"its function body (opset {version}) does not convert to opset {ctx.opset}: "
                        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None


def rename_refs(graph: GraphProto, rename: dict[str, str]) -> None:
    """In place: references of graph's nodes (nested graphs too) to renamed outer names, except the
    names the graph defines itself."""
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    mapping = {k: v for k, v in rename.items() if k not in local}
    for n in graph.node:
        n.input[:] = [mapping.get(t, t) for t in n.input]
        for g in subgraphs(n):
            rename_refs(g, mapping)


def copy_nodes(ctx, nodes, rename: dict[str, str], hint: str) -> None:
    """Add copies of `nodes` to ctx: inputs renamed through `rename`, every output a fresh name (added
    to `rename`), subgraphs' references to renamed names followed."""
    for n in nodes:
        copy = NodeProto()
        copy.CopyFrom(n)
        copy.input[:] = [rename.get(t, t) if t else "" for t in n.input]
        for a in copy.attribute:
            for g in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []):
                rename_refs(g, rename)
        for k, t in enumerate(n.output):
            if t:
                rename[t] = ctx.fresh(f"{hint}/{t}")
                copy.output[k] = rename[t]
        copy.name = ctx.fresh(f"{hint}/{n.op_type}_node")
        ctx.nodes.append(copy)


def inline_graph(ctx, graph: GraphProto, inputs: list[str], hint: str) -> list[str]:
    """The graph's nodes reading `inputs` in place of its own; the names of its outputs."""
    rename = dict(zip([i.name for i in graph.input], inputs))
    for t in graph.initializer:
        rename[t.name] = ctx.const(numpy_helper.to_array(t))
    copy_nodes(ctx, graph.node, rename, hint)
    return [rename.get(o.name, o.name) for o in graph.output]


def inline(ctx, node: NodeProto, body: FunctionProto,
           edit: Callable[[list[NodeProto]], list[NodeProto]] | None = None) -> list[str]:
    """Add the body's nodes reading the node's inputs (rewritten by `edit`, which sees them with the
    body's own tensor names); the recomputed outputs' names."""
    rename = {formal: actual for formal, actual in zip(body.input, list(node.input) + [""] * len(body.input))}
    nodes = _at_opset(ctx, node, body, _resolved(node, body))
    copy_nodes(ctx, edit(nodes) if edit else nodes, rename, node.name or node.op_type)
    return [rename.get(t) for t in body.output]


def function_rule(ctx, node: NodeProto) -> Callable | None:
    """A rule differentiating `node` through its function body, or None when its schema has none."""
    body = function_body(ctx, node)
    if body is None:
        return None

    def rule(ctx, node, grads):
        return through(ctx, node, grads, lambda: inline(ctx, node, body))

    return rule
