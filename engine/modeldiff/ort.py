"""B as onnxruntime on A's file, forward only: every intermediate made a graph output of a copy (in
chunks, so no session holds thousands of outputs), and each node replayed alone on A's values as a
one-node model."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

CHUNK = 400  # outputs per session


@dataclass
class OrtValues:
    values: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    records: dict = field(default_factory=dict)
    graph: object = None
    notes: list = field(default_factory=list)  # what the report says about this side


def _proto(source, model):
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray)):
        return onnx.load_from_string(bytes(source))
    from ..model import Model

    if isinstance(source, Model):
        from ..errors import DiffError

        raise DiffError("against onnxruntime needs the model's file, a path or a ModelProto, not a loaded Model")
    return onnx.load(source)


def _session(proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings about initializers listed as inputs are not ours
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the file's own nodes
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _numpy(v):
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)


def ort_sides(source, model, tape_a, feeds) -> tuple[OrtValues, OrtValues]:
    """(onnxruntime's own values of every node output A ran, onnxruntime's node replayed on A's inputs).
    The replay's `notes` name the nodes onnxruntime would not run alone: they get no local error."""
    import onnx

    proto = _proto(source, model)
    graph = proto.graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    feed = {n: _numpy(feeds[n]) if n in feeds else _numpy(tape_a.values[n]) for n in inputs if n in feeds
            or n in tape_a.values}
    wanted = [t for i in tape_a.order for t in model.graph.nodes[i].output if t and t in tape_a.values]
    plain = OrtValues(graph=model.graph)
    for k in range(0, len(wanted), CHUNK):
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        del copy.graph.output[:]
        copy.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted[k:k + CHUNK])
        names = wanted[k:k + CHUNK]
        for t, v in zip(names, _run_whole(copy, names, feed)):
            plain.values[t] = torch.from_numpy(np.asarray(v))
    replay = OrtValues(graph=model.graph)
    initializers = {t.name: t for t in graph.initializer}
    refused = []
    for i in tape_a.order:
        node = graph.node[i]
        try:
            outs = _replay(proto, node, tape_a, initializers)
        except Exception as e:  # noqa: BLE001 - onnxruntime refusing a one-node model is a note, not a divergence
            refused.append(f"{node.name or node.output[0]!r} ({node.op_type}): {_first_line(e)}")
            continue
        for t, v in zip([t for t in node.output if t], outs):
            replay.values[t] = torch.from_numpy(np.asarray(v))
    if refused:
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        replay.notes.append(f"onnxruntime would not run {len(refused)} node(s) alone, so they have no local error: "
                            + "; ".join(refused[:3]) + more)
    return plain, replay


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


def _run_whole(proto, names, feed) -> list:
    """onnxruntime's run of the whole file; a file it cannot load or run is a one-line DiffError."""
    from ..errors import DiffError

    try:
        return _session(proto).run(names, feed)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors, whatever their class
        raise DiffError(f"onnxruntime cannot run A, so it cannot be compared with it: {_first_line(e)}") from None


def _outer_names(graphs) -> list[str]:
    """The names a node's subgraphs read from outside themselves (an If branch reading the decoder's
    weights and hidden states), nested subgraphs included."""
    from onnx import AttributeProto

    out = []
    for g in graphs:
        inside = {t.name for t in g.initializer} | {t.name for t in g.input} | {t for n in g.node for t in n.output}
        for n in g.node:
            inner = [a.g for a in n.attribute if a.type == AttributeProto.GRAPH]
            inner += [x for a in n.attribute if a.type == AttributeProto.GRAPHS for x in a.graphs]
            out += [t for t in [*n.input, *_outer_names(inner)] if t and t not in inside]
    return list(dict.fromkeys(out))


def _replay(proto, node, tape_a, initializers) -> list:
    """onnxruntime's node on A's values: a model of that node alone, every input fed (a subgraph's outer
    reads too: A's values as inputs, the file's initializers as they are). Raises where onnxruntime
    refuses it; [] where A holds no value for an input."""
    import onnx
    from onnx import AttributeProto, helper

    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    graphs += [g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
    outer = _outer_names(graphs)
    names = list(dict.fromkeys([t for t in node.input if t] + [t for t in outer if t not in initializers]))
    if any(t not in tape_a.values for t in names):
        return []  # a value A did not keep (an optional output it skipped): nothing to replay it on
    feed = {t: _numpy(tape_a.values[t]) for t in names}
    graph = helper.make_graph([node], "replay",
                              [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(feed[t].dtype), None)
                               for t in names],
                              [onnx.ValueInfoProto(name=t) for t in node.output if t],
                              initializer=[initializers[t] for t in outer if t in initializers])
    one = helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version)
    return _session(one).run([t for t in node.output if t], feed)
