"""Rewrite a model so that plain ai.onnx ops compute its gradients: Gradient nodes and selections.

Gradient nodes are lowered innermost first (one whose differentiated slice holds no other Gradient
node), so an outer Gradient differentiates the ops that replaced an inner one: a second derivative.
A Gradient node whose inputs are not the members themselves (the spec's gradient at H = H_1)
differentiates a copy of the forward slice that reads those inputs instead.
"""
from __future__ import annotations

import os
from typing import Sequence

import onnx
from onnx import ModelProto, helper, version_converter

from ..errors import LoweringError
from ..gradient.selection import names as split_names
from ..modelfile.index import TRAINING_DOMAIN, _toposort, subgraphs
from ..modelfile.reader import checkable
from ..modelfile.writer import materialize
from .context import Ctx, attr, collect_types, infer_shapes, known_values
from .contrib import expand_contrib
from .core import backward, cut_slice
from .portable import make_portable
from .scopes import unique_scopes

# ReduceSum takes axes as an input from 13, ScatterElements adds duplicates from 16; LayerNormalization is 17.
MIN_OPSET = 17


def as_proto(model) -> ModelProto:
    """A complete ModelProto of a path, bytes, proto or engine Model (weights included)."""
    if isinstance(model, ModelProto):
        out = ModelProto()
        out.CopyFrom(model)
        return out
    graph = _graph(model)
    return materialize(graph.source, _detached_bytes(graph, graph.source))


def _graph(model):
    """The loaded graph of an engine Model, or of a path, bytes or proto loaded now (one-line errors)."""
    from ..modelfile.reader import read_graph

    graph = getattr(model, "graph", None)
    if graph is not None and hasattr(graph, "weights"):
        return graph
    if isinstance(model, (str, os.PathLike, bytes, ModelProto)):
        return read_graph(model)
    raise TypeError(f"expected a path, bytes, ModelProto or engine Model, got {type(model).__name__}")


def _detached_bytes(graph, proto: ModelProto) -> dict:
    """The bytes of the initializers `proto` still has whose bytes live outside the proto."""
    names = {t.name for t in proto.graph.initializer}
    weights = graph.weights
    return {n: weights.stored(n) for n in weights.detached() if n in names}


def opset_version(proto: ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


def upgraded(proto: ModelProto) -> ModelProto:
    version = opset_version(proto)
    if version >= MIN_OPSET:
        return proto
    if not _uses_default_domain(proto.graph):  # nothing to convert: e.g. only ai.onnx.preview.training's optimizers
        kept = [o for o in proto.opset_import if o.domain not in ("", "ai.onnx")]
        del proto.opset_import[:]
        proto.opset_import.extend(kept + [helper.make_opsetid("", MIN_OPSET)])
        return proto
    try:
        converted = version_converter.convert_version(proto, MIN_OPSET)
    except Exception as exc:
        raise LoweringError(f"cannot convert opset {version} to {MIN_OPSET}: {str(exc).splitlines()[0]}") from None
    before, after = (_output_shapes(infer_shapes(m)) for m in (proto, converted))
    for name, shape in before.items():
        if shape is not None and after.get(name) is not None and after[name] != shape:
            raise LoweringError(f"onnx's version converter (opset {version} to {MIN_OPSET}) changes output {name!r} "
                                f"from shape {list(shape)} to {list(after[name])}")
    return converted


def _uses_default_domain(graph) -> bool:
    for node in graph.node:
        if node.domain in ("", "ai.onnx"):
            return True
        if any(_uses_default_domain(g) for g in subgraphs(node)):
            return True
    return False


def _output_shapes(proto: ModelProto) -> dict:
    out = {}
    for o in proto.graph.output:
        dims = o.type.tensor_type.shape.dim
        static = o.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims)
        out[o.name] = tuple(d.dim_value for d in dims) if static else None
    return out


class Lowering:
    """The model being rewritten, re-typed by shape inference after each step. Initializers whose
    bytes live outside the proto (`weights`, engine/modelfile/weights.py) stay there: shape inference runs on a
    copy that declares them as inputs, and a rule reading their values reads them where they are."""

    def __init__(self, proto: ModelProto, weights=None):
        self.proto = proto
        self.weights = weights
        self.detached = weights.detached() if weights is not None else frozenset()
        self.refresh()

    def refresh(self) -> None:
        g = self.proto.graph
        available = {i.name for i in g.input} | {t.name for t in g.initializer}
        nodes = _toposort(list(g.node), available)
        del g.node[:]
        g.node.extend(nodes)
        del g.value_info[:]
        inferred = infer_shapes(checkable(self.proto, self.detached))  # subgraphs typed too (Loop bodies)
        if self.detached:  # back to the initializers the copy declared as inputs
            del inferred.graph.input[:]
            inferred.graph.input.extend(g.input)
            del inferred.graph.initializer[:]
            inferred.graph.initializer.extend(g.initializer)
        self.proto = inferred
        self.types = collect_types(self.proto)
        self.constants = known_values(self.proto, self.weights)
        self.used = {t for n in self.proto.graph.node for t in list(n.output) + [n.name]}
        self.used |= {i.name for i in self.proto.graph.input} | {t.name for t in self.proto.graph.initializer}

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.proto.graph.node)

    def ctx(self, prefix: str) -> Ctx:
        return Ctx(self.types, self.constants, self.used, prefix, opset_version(self.proto))

    def gradient_nodes(self) -> list[onnx.NodeProto]:
        return [n for n in self.nodes if n.domain == TRAINING_DOMAIN and n.op_type == "Gradient"]

    def replace(self, old: onnx.NodeProto | None, new: Sequence[onnx.NodeProto]) -> None:
        g = self.proto.graph
        kept = [n for n in g.node if n is not old and not (old is not None and n == old)]
        del g.node[:]
        g.node.extend(kept + list(new))
        self.refresh()

    # -- Gradient nodes ------------------------------------------------------------------------
    def innermost(self) -> onnx.NodeProto:
        for n in self.gradient_nodes():
            xs, zs, y = gradient_attrs(n)
            if not any(m.domain == TRAINING_DOMAIN for m in cut_slice(self.nodes, [y], set(xs) | set(zs))):
                return n
        raise LoweringError("the Gradient nodes differentiate each other in a cycle")

    def lower_gradient_node(self, node: onnx.NodeProto) -> None:
        xs, zs, y = gradient_attrs(node)
        members = xs + zs
        label = node.name or "Gradient"
        if list(node.input) != members:
            y, xs, zs = self.copy_slice(node, y, members, len(xs))
            node = next(n for n in self.gradient_nodes() if n.name == label and list(n.output) == list(node.output))
        ctx = self.ctx(label)
        grads = backward(ctx, self.nodes, y, xs, zs, seed=None)
        for out, g in zip(node.output, grads):
            if out:
                ctx.emit("Identity", [g], [out])
        self.replace(node, ctx.nodes)

    def copy_slice(self, node, y: str, members: list[str], n_xs: int):
        """Copy the forward slice so that it reads the Gradient node's inputs in place of the members."""
        ctx = self.ctx(f"{node.name or 'Gradient'}/forward")
        rename = dict(zip(members, node.input))
        for n in cut_slice(self.nodes, [y], set(members)):
            for t in n.output:
                if t:
                    rename[t] = ctx.fresh(t)
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = ctx.fresh(n.name or n.op_type)
            copy.input[:] = [rename.get(t, t) for t in n.input]
            copy.output[:] = [rename.get(t, t) for t in n.output]
            ctx.nodes.append(copy)
        self.replace(None, ctx.nodes)
        inputs = list(node.input)
        return rename.get(y, y), inputs[:n_xs], inputs[n_xs:]

    # -- a selection -----------------------------------------------------------------------------
    def add_selection(self, y: str, xs, zs, dy: str | None, outputs: Sequence[str] | None) -> list[str]:
        from ..gradient.selection import validate
        from ..modelfile.index import index

        spec = validate(index(self.proto), y, xs, zs)
        outputs = list(outputs or [f"d{spec.y}_d{x}" for x in spec.xs])
        if len(outputs) != len(spec.xs):
            raise LoweringError(f"{len(outputs)} output names for {len(spec.xs)} members of xs")
        clash = [o for o in outputs if o in self.used]
        if clash:
            raise LoweringError(f"output name {clash[0]!r} is already a tensor of the model: name it with --names")
        ctx = self.ctx(f"d{spec.y}")
        g = self.proto.graph
        if dy is not None:
            if dy in self.used:
                raise LoweringError(f"dy input name {dy!r} is already a tensor of the model")
            info = self.types.get(spec.y)
            if info is None:
                raise LoweringError(f"the type of y {spec.y!r} is unknown, so no dy input can be declared")
            g.input.append(self.declared(dy, spec.y, info))
            self.types[dy] = info
        grads = backward(ctx, self.nodes, spec.y, spec.xs, spec.zs, seed=dy)
        for x, out, grad in zip(spec.xs, outputs, grads):
            ctx.emit("Identity", [grad], [out])
            g.output.append(self.declared(out, x, self.types.get(x)))
        self.replace(None, ctx.nodes)
        return outputs

    def declared(self, name: str, like: str, info) -> onnx.ValueInfoProto:
        """A value info for `name` typed as `like`, symbolic dimensions (their names) included."""
        g = self.proto.graph
        found = next((v for v in list(g.input) + list(g.value_info) + list(g.output) if v.name == like), None)
        if found is not None and found.type.HasField("tensor_type"):
            out = onnx.ValueInfoProto()
            out.CopyFrom(found)
            out.name = name
            out.doc_string = ""
            return out
        return helper.make_tensor_value_info(name, info.elem_type if info else 1, info.shape if info else None)


def gradient_attrs(node: onnx.NodeProto) -> tuple[list[str], list[str], str]:
    return list(attr(node, "xs", [])), list(attr(node, "zs", []) or []), attr(node, "y")


def _explicit_defaults(graph, opset: int) -> None:
    """In place: ops with an ONNX function body get their defaulted attributes written out. onnx's
    checker infers such a node through its body, whose attribute references do not fall back on the
    schema's defaults (MeanVarianceNormalization without axes fails the full check, lowered or not)."""
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _explicit_defaults(a.g, opset)
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        if not schema.has_function:
            continue
        present = {a.name for a in node.attribute}
        for name, formal in schema.attributes.items():
            if name not in present and formal.default_value.type:
                node.attribute.append(formal.default_value)


def _keep_dropout_masks(graph) -> None:
    """In place: a Dropout that may run in training mode and does not output its mask gets a mask output,
    which its backward reads (the mask this very node draws: the gradient of the same forward pass)."""
    used = {t for n in graph.node for t in list(n.input) + list(n.output)} | {i.name for i in graph.input}
    for node in graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or len(node.input) < 3 or not node.input[2]:
            continue
        if len(node.output) > 1 and node.output[1]:
            continue
        name, k = f"{node.output[0]}/dropout_mask", 1
        while name in used:
            k += 1
            name = f"{node.output[0]}/dropout_mask_{k}"
        used.add(name)
        del node.output[1:]
        node.output.append(name)


def lower(model, y: str | None = None, xs=None, zs=None, *, dy: str | bool | None = None,
          names=None, check: bool = True) -> ModelProto:
    """A copy of `model` in which plain ai.onnx ops compute every gradient.

    Every Gradient node (nested ones too) is replaced; with `y` and `xs`, the gradients of that
    selection become new graph outputs named `names` (default `d{y}_d{x}`), seeded with ones or,
    with `dy`, with a new graph input of y's shape (named `dy` if a string, else `d{y}`).
    """
    proto, data = lowered(model, y, xs, zs, dy=dy, names=names, check=check)
    return materialize(proto, data)


def lowered(model, y: str | None = None, xs=None, zs=None, *, dy: str | bool | None = None,
            names=None, check: bool = True) -> tuple[ModelProto, dict]:
    """`lower` without putting the weights into the proto: (the lowered model with the large
    initializers' bytes left out, those bytes by name), for `engine.modelfile.reader.write` to stream."""
    graph, state = prepared(model, selection=bool(y or xs))
    if y or xs:
        if not y:
            raise LoweringError("--xs needs --y: name the tensor to differentiate")
        dy_name = (dy if isinstance(dy, str) else f"d{y}") if dy else None
        state.add_selection(y, split_names(xs), split_names(zs), dy_name, split_names(names) or None)
    return finished(graph, state, check)


def prepared(model, selection: bool) -> tuple:
    """(the loaded graph, a Lowering of its proto with contrib and non-portable ops written out, the opset
    raised to MIN_OPSET, and every Gradient node lowered), ready for a selection to be added."""
    from ..model import Model

    graph = _graph(model)
    Model(graph)  # one-line errors for bad models, unknown ops and invalid Gradient nodes
    proto = ModelProto()
    proto.CopyFrom(graph.source)
    if not selection and not any(n.domain == TRAINING_DOMAIN and n.op_type == "Gradient" for n in proto.graph.node):
        raise LoweringError("the model has no Gradient node: name a selection with y and xs (--y, --xs)")
    _keep_dropout_masks(proto.graph)
    unique_scopes(proto.graph)
    state = Lowering(upgraded(expand_contrib(proto, graph.weights)), graph.weights)
    if make_portable(state.proto, graph.weights, state.types, state.constants):
        state.refresh()
    while state.gradient_nodes():
        state.lower_gradient_node(state.innermost())
    return graph, state


def finished(graph, state: Lowering, check: bool) -> tuple[ModelProto, dict]:
    """The lowered proto (defaults written out, the training domain dropped where unused, fully checked)
    and the bytes of the initializers left outside it."""
    out = state.proto
    _explicit_defaults(out.graph, opset_version(out))
    if not any(n.domain == TRAINING_DOMAIN for n in out.graph.node):
        kept = [o for o in out.opset_import if o.domain != TRAINING_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(kept)
    if check:
        try:
            onnx.checker.check_model(checkable(out, state.detached), full_check=True)
        except Exception as exc:  # noqa: BLE001 - onnx's checker or its shape inference, in one line
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LoweringError(f"the lowered model fails onnx's full check: {text}") from None
    return out, _detached_bytes(graph, out)
