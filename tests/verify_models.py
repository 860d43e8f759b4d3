"""Models for the verifier's tests and benchmark, built with onnx.helper (fixed seeds)."""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_models")


def make(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "verify_test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxgrad-tests")
    model.ir_version = 9
    return model


def vi(name: str, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, array: np.ndarray):
    return numpy_helper.from_array(array, name)


def to_float64(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The same model computed in double: float initializers, declared types, Cast targets, constants."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    g = m.graph
    for t in g.initializer:
        if t.data_type == F32:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == F32:
            v.type.tensor_type.elem_type = F64
    for node in g.node:
        for a in node.attribute:
            if a.name == "to" and a.i == F32:
                a.i = F64
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == F32:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    return m


def deep_chain(depth: int = 12, width: int = 32, batch: int = 4, elem=F32) -> onnx.ModelProto:
    """depth x (MatMul width x width -> Tanh) on a batch x width input: per-call overhead dominates."""
    rng = np.random.default_rng(0)
    dtype = np.float32 if elem == F32 else np.float64
    nodes, inits, cur = [], [], "x"
    for i in range(depth):
        inits.append(init(f"w{i}", (rng.standard_normal((width, width)) / np.sqrt(width)).astype(dtype)))
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        cur = f"t{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="out"))
    return make(nodes, [vi("x", [batch, width], elem)], [vi("y", [batch, width], elem)], inits)


def small_cnn(batch: int = 8, elem=F32) -> onnx.ModelProto:
    """Conv(3->8) Tanh MaxPool Conv(8->16) Tanh GlobalAveragePool Flatten Gemm(16->10) on 3x16x16 images."""
    rng = np.random.default_rng(1)
    dtype = np.float32 if elem == F32 else np.float64
    w1 = (rng.standard_normal((8, 3, 3, 3)) / np.sqrt(27)).astype(dtype)
    w2 = (rng.standard_normal((16, 8, 3, 3)) / np.sqrt(72)).astype(dtype)
    fc = (rng.standard_normal((16, 10)) / 4).astype(dtype)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["c1"], ["a1"], name="act1"),
        helper.make_node("MaxPool", ["a1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["c2"], ["a2"], name="act2"),
        helper.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc"),
    ]
    return make(nodes, [vi("x", [batch, 3, 16, 16], elem)], [vi("y", [batch, 10], elem)],
                [init("w1", w1), init("w2", w2), init("fc", fc)])


def light_path(stem: str) -> str:
    return os.path.join(LIGHT, f"light_{stem}.onnx")


def light_models() -> list[str]:
    return sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx")))


def light_feeds(model, seed: int = 0) -> tuple[dict[str, np.ndarray], list[str]]:
    """Random values for a light model: every ConstantOfShape weight (an intermediate) scaled by its
    fan-in so activations stay O(1), BatchNorm variances positive, and the graph inputs."""
    graph = model.graph
    made = [n.output[0] for n in graph.nodes if n.op_type == "ConstantOfShape"]
    shapes = {name: value.shape for name, value in model.run({}, outputs=made).items()}
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in made:
        shape = shapes[name]
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        value = rng.standard_normal(shape) / np.sqrt(fan_in)
        if "var" in name or "riv" in name:
            value = np.abs(value) + 0.5
        feeds[name] = value.astype(np.float32)
    for name in graph.inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in graph.types[name].shape)
        feeds[name] = (rng.standard_normal(shape) * (1.0 if len(shape) == 4 else 0.1)).astype(np.float32)
    return feeds, made


def light_selection(model, xs: list[str]) -> tuple[str, list[str]]:
    """(y, zs) for a light model: every other fed tensor is held fixed."""
    feeds_names = [n.output[0] for n in model.graph.nodes if n.op_type == "ConstantOfShape"] + list(model.graph.inputs)
    return model.outputs[0], [n for n in feeds_names if n not in xs]
