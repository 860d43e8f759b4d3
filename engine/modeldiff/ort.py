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
    """(onnxruntime's own values of every node output A ran, onnxruntime's node replayed on A's inputs)."""
    import onnx

    proto = _proto(source, model)
    graph = proto.graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    feed = {n: _numpy(feeds[n]) if n in feeds else _numpy(tape_a.values[n]) for n in inputs if n in feeds
            or n in tape_a.values}
    wanted = [t for i in tape_a.order for t in model.graph.nodes[i].output if t and t in tape_a.values]
    plain = OrtValues(graph=model.graph)
    existing = {o.name for o in graph.output}
    for k in range(0, len(wanted), CHUNK):
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        del copy.graph.output[:]
        copy.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted[k:k + CHUNK])
        names = wanted[k:k + CHUNK]
        for t, v in zip(names, _session(copy).run(names, feed)):
            plain.values[t] = torch.from_numpy(np.asarray(v))
    del existing
    replay = OrtValues(graph=model.graph)
    for i in tape_a.order:
        node = graph.node[i]
        for t, v in zip([t for t in node.output if t], _replay(proto, node, tape_a)):
            replay.values[t] = torch.from_numpy(np.asarray(v))
    return plain, replay


def _replay(proto, node, tape_a) -> list:
    """onnxruntime's node on A's values: a model of that node alone, every input fed."""
    import onnx
    from onnx import helper

    names = [t for t in node.input if t]
    if any(t not in tape_a.values for t in names) or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
        return []  # a node with a subgraph reads outer values: compared by its accumulated error only
    feed = {t: _numpy(tape_a.values[t]) for t in names}
    graph = helper.make_graph([node], "replay",
                              [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(feed[t].dtype), None)
                               for t in dict.fromkeys(names)],
                              [onnx.ValueInfoProto(name=t) for t in node.output if t])
    one = helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version)
    try:
        return _session(one).run([t for t in node.output if t], feed)
    except Exception:  # noqa: BLE001 - a node onnxruntime cannot run alone: judged by accumulated error
        return []
