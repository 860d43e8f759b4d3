"""One-node (or few-node) models for the lowered JVP's op tests: every forward rule of
engine/lowering/jvp, and ops that go through their backward rule transposed. Each case's float inputs
are all xs, so every operand's tangent term is exercised; integer operands are initializers."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18


@dataclass(frozen=True)
class OpCase:
    name: str
    op: str
    inputs: dict  # float input -> shape (all differentiated)
    attrs: dict = field(default_factory=dict)
    consts: dict = field(default_factory=dict)  # initializer -> array (integer operands, held)
    order: tuple = ()  # the node's inputs in order ('' for an omitted one); default: inputs then consts
    positive: tuple = ()  # inputs drawn positive (Log, Sqrt, Pow's base, variances)
    outputs: int = 1
    opset: int = OPSET
    interval: tuple = ()  # inputs drawn uniformly from (low, high) (Asin, Acosh, ...)
    dtypes: tuple = (np.float64, np.float32)  # the first onnxruntime has every kernel for is compared
    kinks: tuple = ()  # the first input's values, where they sit on the op's kinks (torch's conventions there)


def ints(*values):
    return np.asarray(values, np.int64)


CASES = [
    OpCase("add_broadcast", "Add", {"a": (2, 3), "b": (3,)}),
    OpCase("sub_broadcast", "Sub", {"a": (3,), "b": (2, 3)}),
    OpCase("mul", "Mul", {"a": (2, 3), "b": (2, 1)}),
    OpCase("div", "Div", {"a": (2, 3), "b": (3,)}, positive=("b",)),
    OpCase("pow", "Pow", {"a": (2, 3), "b": (3,)}, positive=("a",)),
    OpCase("pow_square", "Pow", {"a": (2, 3)}, consts={"two": np.asarray(2.0, np.float32)}),
    OpCase("sum3", "Sum", {"a": (2, 3), "b": (3,), "c": (1, 3)}),
    OpCase("neg", "Neg", {"a": (2, 3)}),
    OpCase("exp", "Exp", {"a": (2, 3)}),
    OpCase("log", "Log", {"a": (2, 3)}, positive=("a",)),
    OpCase("sqrt", "Sqrt", {"a": (2, 3)}, positive=("a",)),
    OpCase("reciprocal", "Reciprocal", {"a": (2, 3)}, positive=("a",)),
    OpCase("abs", "Abs", {"a": (2, 3)}),
    OpCase("tanh", "Tanh", {"a": (2, 3)}),
    OpCase("sigmoid", "Sigmoid", {"a": (2, 3)}),
    OpCase("erf", "Erf", {"a": (2, 3)}),
    OpCase("relu", "Relu", {"a": (2, 3)}),
    OpCase("relu_kinks", "Relu", {"a": (2, 3)}, kinks=(0, -1, 2, 0, 0.5, -0.0)),
    OpCase("leaky_relu_kinks", "LeakyRelu", {"a": (2, 3)}, kinks=(0, -1, 2, 0, 0.5, -0.0)),
    OpCase("hard_swish_kinks", "HardSwish", {"a": (2, 3)}, kinks=(-3, 3, -4, 4, 0, 1.5)),
    OpCase("hard_sigmoid_kinks", "HardSigmoid", {"a": (2, 3)}, kinks=(-2.5, 2.5, -3, 3, 0, 1)),
    # float32 N×C×H×W with C a multiple of 16: the steps and affine maps onnxruntime keeps blocked (jvp/layout.py)
    OpCase("hard_swish_kinks_f32", "HardSwish", {"a": (2, 3)}, kinks=(-3, 3, -4, 4, 0, 1.5), dtypes=(np.float32,)),
    OpCase("hard_swish_beside_kinks_f32", "HardSwish", {"a": (2, 3)}, dtypes=(np.float32,),  # the steps' exactness
           kinks=tuple(float(np.nextafter(np.float32(k), np.float32(to))) for k, to in
                       ((-3, -9), (-3, 0), (3, 0), (3, 9), (-3, -3), (3, 3)))),
    OpCase("hard_swish_blocked", "HardSwish", {"a": (1, 16, 2, 2)}, dtypes=(np.float32,),
           kinks=(-3, 3, -4, 4, 0, 1.5, -1.5, 2.5) * 8),
    OpCase("sigmoid_blocked", "Sigmoid", {"a": (1, 16, 2, 2)}, dtypes=(np.float32,)),
    OpCase("clip_kinks", "Clip", {"a": (2, 3)}, consts={"lo": np.asarray(-0.5), "hi": np.asarray(0.75)},
           kinks=(-0.5, 0.75, -1, 1, 0, 0.25)),
    OpCase("gelu", "Gelu", {"a": (2, 3)}, opset=20),
    OpCase("gelu_tanh", "Gelu", {"a": (2, 3)}, {"approximate": "tanh"}, opset=20),
    OpCase("where", "Where", {"a": (3,), "b": (2, 3)}, consts={"c": np.asarray([[True, False, True]] * 2)},
           order=("c", "a", "b")),
    OpCase("cast_double", "Cast", {"a": (2, 3)}, {"to": TensorProto.DOUBLE}),
    OpCase("identity", "Identity", {"a": (2, 3)}),
    OpCase("dropout_inference", "Dropout", {"a": (2, 3)}),
    OpCase("reshape", "Reshape", {"a": (2, 3)}, consts={"s": ints(3, 2)}),
    OpCase("flatten", "Flatten", {"a": (2, 3, 2)}, {"axis": 2}),
    OpCase("transpose", "Transpose", {"a": (2, 3, 4)}, {"perm": [2, 0, 1]}),
    OpCase("squeeze", "Squeeze", {"a": (2, 1, 3)}, consts={"ax": ints(1)}),
    OpCase("unsqueeze", "Unsqueeze", {"a": (2, 3)}, consts={"ax": ints(0)}),
    OpCase("expand", "Expand", {"a": (3, 1)}, consts={"s": ints(2, 3, 4)}),
    OpCase("slice", "Slice", {"a": (4, 5)}, consts={"st": ints(3, 1), "en": ints(0, 5), "ax": ints(0, 1),
                                                   "sp": ints(-1, 2)}),
    OpCase("gather", "Gather", {"a": (4, 3)}, {"axis": 0}, consts={"i": ints(2, 0, 2)}),
    OpCase("gather_elements", "GatherElements", {"a": (2, 3)}, {"axis": 1}, consts={"i": ints(0, 2, 1, 1).reshape(2, 2)}),
    OpCase("gather_nd", "GatherND", {"a": (2, 3)}, consts={"i": ints(0, 1, 1, 2).reshape(2, 2)}),
    OpCase("space_to_depth", "SpaceToDepth", {"a": (1, 1, 4, 4)}, {"blocksize": 2}),
    OpCase("trilu", "Trilu", {"a": (3, 3)}, {"upper": 0}),
    OpCase("compress", "Compress", {"a": (3, 2)}, {"axis": 0}, consts={"c": np.asarray([True, False, True])}),
    OpCase("reverse_sequence", "ReverseSequence", {"a": (3, 2)}, {"time_axis": 0, "batch_axis": 1},
           consts={"n": ints(2, 3)}),
    OpCase("cast_like", "CastLike", {"a": (2, 3)}, consts={"like": np.zeros(1)}),
    OpCase("tile", "Tile", {"a": (2, 3)}, consts={"r": ints(2, 1)}),
    OpCase("reduce_sum", "ReduceSum", {"a": (2, 3, 4)}, {"keepdims": 0}, consts={"ax": ints(1)}),
    OpCase("reduce_mean", "ReduceMean", {"a": (2, 3, 4)}, consts={"ax": ints(0, 2)}),
    OpCase("cumsum", "CumSum", {"a": (2, 3)}, {"reverse": 1}, consts={"ax": np.asarray(1, np.int64)}),
    OpCase("split", "Split", {"a": (2, 5)}, {"axis": 1}, consts={"sp": ints(2, 3)}, outputs=2),
    OpCase("concat", "Concat", {"a": (2, 3), "b": (2, 1)}, {"axis": 1}),
    OpCase("pad_constant", "Pad", {"a": (2, 3), "v": ()}, consts={"p": ints(1, 0, 0, 2)}, order=("a", "p", "v")),
    OpCase("pad_reflect", "Pad", {"a": (3, 4)}, {"mode": "reflect"}, consts={"p": ints(1, 2, 1, 1)}),
    OpCase("depth_to_space", "DepthToSpace", {"a": (1, 4, 2, 3)}, {"blocksize": 2}),
    OpCase("resize_linear", "Resize", {"a": (1, 1, 3, 4)}, {"mode": "linear"},
           consts={"sc": np.asarray([1, 1, 2, 1.5], np.float32)}, order=("a", "", "sc")),
    OpCase("matmul_batched", "MatMul", {"a": (2, 3, 4), "b": (4, 5)}),
    OpCase("einsum", "Einsum", {"a": (2, 3), "b": (3, 4)}, {"equation": "ij,jk->ik"}),
    OpCase("gemm", "Gemm", {"a": (3, 2), "b": (4, 3), "c": (4,)}, {"transA": 1, "transB": 1, "alpha": 0.5,
                                                                  "beta": 2.0}),
    OpCase("conv", "Conv", {"x": (1, 2, 5, 5), "w": (4, 1, 3, 3), "b": (4,)},
           {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    OpCase("conv_transpose", "ConvTranspose", {"x": (1, 2, 3, 3), "w": (2, 3, 2, 2), "b": (3,)}, {"strides": [2, 2]}),
    OpCase("batch_norm", "BatchNormalization", {"x": (2, 3, 4), "s": (3,), "b": (3,)},
           consts={"m": np.asarray([0.5, -1, 2]), "v": np.asarray([0.5, 1, 2])}),  # running stats: held
    OpCase("average_pool", "AveragePool", {"x": (1, 2, 5, 5)}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                                "strides": [2, 2]}),
    OpCase("global_average_pool", "GlobalAveragePool", {"x": (1, 2, 3, 3)}),
    OpCase("softmax", "Softmax", {"a": (2, 3, 4)}, {"axis": 1}),
    OpCase("log_softmax", "LogSoftmax", {"a": (2, 5)}),
    OpCase("layer_norm", "LayerNormalization", {"x": (2, 3, 4), "s": (3, 4), "b": (4,)}, {"axis": -2}),
    # no forward rule: the backward rule transposed
    OpCase("max_ties", "Max", {"a": (2, 3), "b": (3,)}),
    OpCase("clip", "Clip", {"a": (2, 3), "lo": (), "hi": ()}),
    OpCase("leaky_relu", "LeakyRelu", {"a": (2, 3)}, {"alpha": 0.1}),
    OpCase("hard_swish", "HardSwish", {"a": (2, 3)}, interval=(-5, 5)),
    OpCase("hard_sigmoid", "HardSigmoid", {"a": (2, 3)}, {"alpha": 0.3}, interval=(-4, 4)),
    OpCase("softplus", "Softplus", {"a": (2, 3)}),
    OpCase("reduce_max", "ReduceMax", {"a": (2, 3, 4)}, consts={"ax": ints(1)}),
    OpCase("max_pool", "MaxPool", {"x": (1, 2, 4, 4)}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    OpCase("instance_norm", "InstanceNormalization", {"x": (2, 3, 4), "s": (3,), "b": (3,)}),
    OpCase("batch_norm_training", "BatchNormalization", {"x": (2, 3, 4), "s": (3,), "b": (3,), "m": (3,), "v": (3,)},
           {"training_mode": 1}, positive=("v",), outputs=3),
    OpCase("reduce_sum_square", "ReduceSumSquare", {"a": (2, 3)}, consts={"ax": ints(1)}),
    OpCase("clip_x", "Clip", {"a": (2, 3)}, consts={"lo": np.asarray(-0.5), "hi": np.asarray(0.7)}),
    OpCase("prelu", "PRelu", {"a": (2, 3)}, consts={"slope": np.asarray([0.1, 0.2, 0.3])}),
    OpCase("swish", "Swish", {"a": (2, 3)}, {"alpha": 0.7}, opset=24),
    *[OpCase(op.lower(), op, {"a": (2, 3)}, attrs, interval=interval, opset=opset) for op, attrs, interval, opset in (
        ("Sin", {}, (), OPSET), ("Cos", {}, (), OPSET), ("Tan", {}, (-1, 1), OPSET), ("Asin", {}, (-0.9, 0.9), OPSET),
        ("Acos", {}, (-0.9, 0.9), OPSET), ("Atan", {}, (), OPSET), ("Sinh", {}, (), OPSET), ("Cosh", {}, (), OPSET),
        ("Asinh", {}, (), OPSET), ("Acosh", {}, (1.2, 3), OPSET), ("Atanh", {}, (-0.9, 0.9), OPSET),
        ("ThresholdedRelu", {"alpha": 0.3}, (), OPSET), ("Elu", {}, (), OPSET), ("Selu", {}, (), OPSET),
        ("Softsign", {}, (), OPSET),
        ("Shrink", {"bias": 0.1, "lambd": 0.3}, (), OPSET), ("Mish", {}, (), OPSET))],
    OpCase("celu", "Celu", {"a": (2, 3)}, {"alpha": 0.8}, dtypes=(np.float32,)),  # Celu is float32 only
    OpCase("group_norm_body", "GroupNormalization", {"x": (2, 4, 3), "s": (4,), "b": (4,)}, {"num_groups": 2},
           opset=21),
]


def build(case: OpCase, dtype=np.float32, seed: int = 0):
    """(model, y, xs, feeds, tangents) of one case in `dtype` (float inputs and float constants)."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    feeds, tangents = {}, {}
    for name, shape in case.inputs.items():
        value = rng.standard_normal(shape)
        if case.op == "Max":  # ties between the operands, which split the tangent
            value = np.round(value)
        if case.interval:
            value = rng.uniform(*case.interval, size=shape)
        if case.kinks and name == next(iter(case.inputs)):
            value = np.asarray(case.kinks).reshape(shape)
        feeds[name] = (np.abs(value) + 0.5 if name in case.positive else value).astype(dtype)
        tangents[name] = rng.standard_normal(shape).astype(dtype)
    # float constants are data in the case's type, but Resize's scales stay float32
    consts = {k: (v.astype(dtype) if v.dtype.kind == "f" and case.op != "Resize" else v)
              for k, v in case.consts.items()}
    order = case.order or (tuple(case.inputs) + tuple(case.consts))
    outs = [f"y{k}" for k in range(case.outputs)]
    node = helper.make_node(case.op, list(order), outs, name="node", **case.attrs)
    graph = helper.make_graph([node], case.name,
                              [helper.make_tensor_value_info(n, elem, s) for n, s in case.inputs.items()], [],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    first = next(iter(case.inputs))  # an op typed only through its function body keeps x's shape
    model.graph.output.extend(typed[o] if o in typed else helper.make_tensor_value_info(o, elem, case.inputs[first])
                              for o in outs)
    return model, outs[0], list(case.inputs), feeds, tangents
