"""Small helpers shared by the sample builders: one call per model, every byte under our control."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

TRAINING_DOMAIN = "ai.onnx.preview.training"
OPSET = 17  # LayerNormalization needs 17; engine.examples.spec_conv_gemm uses it too
IR_VERSION = 8
PRODUCER = "onnxgrad sample_models/build.py"
FLOAT = TensorProto.FLOAT

Shape = Sequence[int]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(generator: np.random.Generator, shape: Shape, scale: float = 1.0) -> np.ndarray:
    return (generator.standard_normal(tuple(shape)) * scale).astype(np.float32)


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str | None = None,
         domain: str = "", **attrs) -> NodeProto:
    return helper.make_node(op_type, list(inputs), list(outputs), name=name or outputs[0] or op_type,
                            domain=domain, **attrs)


def gradient(inputs: Sequence[str], outputs: Sequence[str], name: str, *, xs: Sequence[str], y: str,
             zs: Sequence[str] = ()) -> NodeProto:
    attrs = {"xs": list(xs), "y": y}
    if zs:
        attrs["zs"] = list(zs)
    return helper.make_node("Gradient", list(inputs), list(outputs), name=name, domain=TRAINING_DOMAIN, **attrs)


def _value_info(name: str, shape: Shape | None, elem_type: int = FLOAT):
    return helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))


def _elem_type(array: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(array.dtype)


def make_model(name: str, doc: str, nodes: Iterable[NodeProto], *,
               outputs: Sequence[tuple[str, Shape]],
               defaults: dict[str, np.ndarray] | None = None,
               params: dict[str, np.ndarray] | None = None,
               inputs: Sequence[tuple[str, Shape]] = ()) -> ModelProto:
    """A model with three kinds of starting values.

    inputs:   graph inputs with no value; the user must feed them (`--feed NAME=SPEC`).
    defaults: graph inputs that also have an initializer: a default the user may override.
    params:   plain initializers (weights and constants).
    """
    defaults, params = defaults or {}, params or {}
    nodes = list(nodes)
    graph_inputs = [_value_info(n, s) for n, s in inputs]
    graph_inputs += [_value_info(n, a.shape, _elem_type(a)) for n, a in defaults.items()]
    initializers = [numpy_helper.from_array(a, n) for n, a in list(defaults.items()) + list(params.items())]
    graph = helper.make_graph(nodes, name, graph_inputs, [_value_info(n, s) for n, s in outputs],
                              initializer=initializers, doc_string=doc)
    return finish(graph, training=any(n.domain == TRAINING_DOMAIN for n in nodes))


def finish(graph, training: bool) -> ModelProto:
    opsets = [helper.make_opsetid("", OPSET)]
    if training:
        opsets.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    return model


def float16(model: ModelProto) -> ModelProto:
    """The same model in float16 (as `model.half()` before export gives): every float tensor,
    declared type and Constant; the values are rounded once."""
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for t in list(g.initializer) + [a.t for n in g.node for a in n.attribute if a.type == a.TENSOR]:
        if t.data_type == FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    g.name += "_fp16"
    return out
