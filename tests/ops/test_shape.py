"""Shape, indexing, generator and sequence ops: ONNX node cases, older opsets, gradients, vmap."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import engine
from engine.dtypes import to_numpy
from engine.errors import OnnxGradError, UnsupportedOpError
from engine.registry import lookup
from engine.run.values import array_to_tensor

MINE = {
    "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
    "ScatterElements", "ScatterND", "Scatter", "Shape", "Size", "Expand", "Tile", "Pad", "Squeeze",
    "Unsqueeze", "Flatten", "Range", "ConstantOfShape", "Constant", "NonZero", "OneHot", "DepthToSpace",
    "SpaceToDepth", "EyeLike", "Trilu", "ReverseSequence", "Compress", "Unique", "CenterCropPad",
    "SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert", "SequenceErase",
    "SequenceLength", "ConcatFromSequence", "SplitToSequence",
}


def _collect():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.model import collect_testcases as model_cases
        from onnx.backend.test.case.node import collect_testcases as node_cases

        cases = list(node_cases(None)) + [c for c in model_cases() if c.model is not None]
    own = {c.name for c in cases if {n.op_type for n in c.model.graph.node} <= MINE}
    # the function-expanded variants of our ops exercise them too (they may need other families' ops)
    return [c for c in cases if c.name in own or (c.name.endswith("_expanded") and c.name[:-9] in own)]


CASES = _collect()


def fn(op, opset=25):
    impl = lookup("", op, opset)
    assert impl is not None, f"{op} opset {opset} is not registered"
    return impl.fn


def _to_torch(v):
    return [_to_torch(x) for x in v] if isinstance(v, list) else array_to_tensor(np.asarray(v), torch.device("cpu"))


def _to_numpy(v):
    return [_to_numpy(x) for x in v] if isinstance(v, list) else to_numpy(v)


def assert_same(got, want, rtol=1e-6, atol=1e-7):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, rtol, atol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


def run_model(model, inputs, n_outputs=None):
    """Engine outputs for positional `inputs`; sequence feeds go through a Plan as lists of tensors."""
    m = engine.load(model, check=False)
    g = model.graph
    names = [i.name for i in g.input][: len(inputs)]
    outs = [o.name for o in g.output][:n_outputs]
    if any(isinstance(v, list) for v in inputs):
        return [_to_numpy(v) for v in m.prepare(names, outs).run([_to_torch(v) for v in inputs])]
    got = m.run({n: np.asarray(v) for n, v in zip(names, inputs)}, outputs=outs)
    return [got[n] for n in outs]


# --- ONNX's own node and model cases -------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_case(case):
    try:
        engine.load(case.model, check=False)
    except UnsupportedOpError as exc:
        missing = {n.op_type for n in case.model.graph.node} - MINE
        if not missing:
            raise
        pytest.skip(f"needs another family's op: {exc}"[:200])
    rtol = getattr(case, "rtol", None) or 1e-3
    atol = getattr(case, "atol", None) or 1e-7
    for inputs, expected in case.data_sets:
        got = run_model(case.model, list(inputs), len(expected))
        for g, w in zip(got, expected):
            assert_same(g, w, rtol, atol)


# --- older opsets and attribute variants, against onnx's reference evaluator -------------------

def _vi(name, arr):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype),
                                         np.asarray(arr).shape)


def single_node(op, inputs: dict, opset, n_outputs=1, out_type=None, **attrs):
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    first = next(iter(arrays.values())) if arrays else np.zeros(1, np.float32)
    elem = out_type or helper.np_dtype_to_tensor_dtype(first.dtype)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, list(arrays), outs, **attrs)
    graph = helper.make_graph([node], op, [_vi(k, v) for k, v in arrays.items()],
                              [helper.make_tensor_value_info(o, elem, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, list(arrays.values())


def check_against_reference(op, inputs, opset, n_outputs=1, out_type=None, **attrs):
    model, feeds = single_node(op, inputs, opset, n_outputs, out_type, **attrs)
    want = ReferenceEvaluator(model).run(None, dict(zip(inputs, feeds)))
    got = run_model(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)


X345 = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
I64 = np.int64
VARIANTS = [
    ("Slice", {"x": X345}, 9, 1, dict(starts=[1, -3], ends=[100, -1], axes=[0, 2])),
    ("Slice", {"x": X345, "s": np.array([-1, 4], I64), "e": np.array([-2**63, 0], I64),
               "a": np.array([1, 2], I64), "t": np.array([-2, -3], I64)}, 13, 1, {}),
    ("Slice", {"x": X345, "s": np.array([2**63 - 1], I64), "e": np.array([-2**63], I64),
               "a": np.array([-1], I64), "t": np.array([-1], I64)}, 13, 1, {}),
    ("Split", {"x": X345}, 11, 2, dict(axis=2, split=[2, 3])),
    ("Split", {"x": X345}, 11, 2, dict(axis=1)),
    ("Split", {"x": X345}, 18, 3, dict(axis=1, num_outputs=3)),
    ("Split", {"x": X345, "s": np.array([1, 0, 2], I64)}, 13, 3, dict(axis=0)),
    ("Pad", {"x": X345}, 10, 1, dict(pads=[0, 1, 2, 1, 0, 3], mode="reflect")),
    ("Pad", {"x": X345}, 10, 1, dict(pads=[1, 0, 0, 0, 2, 1], value=-7.5)),
    ("Pad", {"x": X345, "p": np.array([2, 0, 3, 1, 2, 0], I64)}, 11, 1, dict(mode="edge")),
    ("Pad", {"x": X345, "p": np.array([5, 7], I64), "c": np.array(0.0, np.float32),
             "a": np.array([-1], I64)}, 19, 1, dict(mode="wrap")),
    ("Pad", {"x": X345, "p": np.array([5, 9], I64), "c": np.array(0.0, np.float32),
             "a": np.array([2], I64)}, 19, 1, dict(mode="reflect")),
    ("Squeeze", {"x": X345.reshape(3, 1, 4, 1, 5)}, 11, 1, dict(axes=[1, -2])),
    ("Squeeze", {"x": X345.reshape(3, 1, 4, 1, 5)}, 13, 1, {}),
    ("Unsqueeze", {"x": X345}, 11, 1, dict(axes=[-1, 0])),
    ("Flatten", {"x": X345}, 11, 1, dict(axis=-1)),
    ("Flatten", {"x": X345}, 11, 1, dict(axis=0)),
    ("Reshape", {"x": X345, "s": np.array([0, -1], I64)}, 13, 1, {}),
    ("Transpose", {"x": X345}, 13, 1, dict(perm=[1, 2, 0])),
    ("Concat", {"a": X345, "b": X345[:, :1]}, 11, 1, dict(axis=-2)),
    ("Gather", {"x": X345, "i": np.array([[-1, 0], [2, -4]], I64)}, 13, 1, dict(axis=1)),
    ("Gather", {"x": X345, "i": np.array(-2, np.int32)}, 13, 1, dict(axis=-1)),
    ("GatherElements", {"x": X345, "i": np.array([[[-1, 0, 2, 3, 1]]] * 3, I64)}, 13, 1, dict(axis=1)),
    ("GatherND", {"x": X345, "i": np.array([[[-1], [0]], [[1], [2]], [[0], [3]]], I64)}, 13, 1,
     dict(batch_dims=1)),
    ("GatherND", {"x": X345, "i": np.array([[2, -1, 0], [0, 1, 4]], I64)}, 12, 1, {}),
    ("ScatterND", {"x": X345, "i": np.array([[-1, 0], [0, 2]], I64), "u": -np.ones((2, 5), np.float32)},
     11, 1, {}),
    ("ScatterND", {"x": X345, "i": np.array([[1], [1]], I64), "u": np.full((2, 4, 5), 2, np.float32)},
     16, 1, dict(reduction="mul")),
    ("ScatterElements", {"x": X345, "i": np.array([[[0, -1]]], I64), "u": np.array([[[9, 8]]], np.float32)},
     18, 1, dict(axis=2, reduction="max")),
    ("Expand", {"x": X345[:, :1], "s": np.array([2, 1, 1, 1], I64)}, 13, 1, {}),
    ("Tile", {"x": X345, "r": np.array([1, 2, 1], I64)}, 13, 1, {}),
    ("Shape", {"x": X345}, 15, 1, dict(start=-2), TensorProto.INT64),
    ("Size", {"x": X345}, 13, 1, {}, TensorProto.INT64),
    ("DepthToSpace", {"x": np.arange(32, dtype=np.float32).reshape(1, 8, 2, 2)}, 13, 1,
     dict(blocksize=2, mode="CRD")),
    ("SpaceToDepth", {"x": np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)}, 13, 1, dict(blocksize=2)),
    ("Trilu", {"x": X345, "k": np.array(-1, I64)}, 14, 1, dict(upper=0)),
    ("Compress", {"x": X345, "c": np.array([False, True, True, False, True])}, 11, 1, dict(axis=-1)),
    ("OneHot", {"i": np.array([[1, -1], [5, 0]], I64), "d": np.array(4, I64),
                "v": np.array([-1.0, 3.0], np.float32)}, 11, 1, dict(axis=0), TensorProto.FLOAT),
    ("ReverseSequence", {"x": X345[0], "l": np.array([1, 4, 2, 3, 4], I64)}, 10, 1,
     dict(batch_axis=1, time_axis=0)),
    ("Unique", {"x": np.array([[3, 1], [3, 1], [0, 2], [3, 1]], I64)}, 11, 4, dict(axis=0, sorted=0)),
    ("Unique", {"x": np.array([4, 1, 4, 0, 1, 7], np.float32)}, 11, 4, dict(sorted=0)),
    ("Range", {"s": np.array(5, np.int32), "l": np.array(-4, np.int32), "d": np.array(-3, np.int32)}, 11, 1, {}),
    ("Range", {"s": np.array(0.5, np.float32), "l": np.array(2.1, np.float32), "d": np.array(0.3, np.float32)},
     11, 1, {}),
    ("EyeLike", {"x": np.zeros((3, 5), np.int32)}, 9, 1, dict(k=2, dtype=TensorProto.FLOAT), TensorProto.FLOAT),
    ("CenterCropPad", {"x": X345, "s": np.array([6, 3], I64)}, 18, 1, dict(axes=[1, -1])),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v[0]}-opset{v[2]}-{i}" for i, v in enumerate(VARIANTS)])
def test_variant_matches_reference(variant):
    op, inputs, opset, n_out, attrs, *out_type = variant
    check_against_reference(op, inputs, opset, n_out, out_type[0] if out_type else None, **attrs)


# where onnx's reference evaluator departs from the spec, onnxruntime is the oracle
ORT_VARIANTS = [
    ("Slice", {"x": X345, "s": np.array([-2**63, 2], I64), "e": np.array([-2**63, -100], I64),
               "a": np.array([0, 2], I64), "t": np.array([-1, -2], I64)}, 13, 1, {}),
    ("Pad", {"x": X345, "p": np.array([-1, 2, 0, 0, -1, 1], I64)}, 13, 1, dict(mode="edge")),
    ("Pad", {"x": X345, "p": np.array([0, 0, 1, 0, 0, -2], I64)}, 13, 1, dict(mode="reflect")),
    ("OneHot", {"i": np.array([1.7, -1.0, 3.0], np.float32), "d": np.array(4.0, np.float32),
                "v": np.array([0, 5], np.float32)}, 11, 1, {}),
    ("Squeeze", {"x": X345.reshape(1, 3, 1, 20), "a": np.zeros(0, I64)}, 13, 1, {}),
    ("Unique", {"x": np.array([[3, 1], [3, 1], [0, 2], [3, 1], [0, 2], [-1, 9]], I64)}, 11, 4,
     dict(axis=0, sorted=0)),
]


@pytest.mark.parametrize("variant", ORT_VARIANTS, ids=[f"{v[0]}-opset{v[2]}-{i}" for i, v in enumerate(ORT_VARIANTS)])
def test_variant_matches_onnxruntime(variant):
    ort = pytest.importorskip("onnxruntime")
    op, inputs, opset, n_out, attrs = variant
    model, feeds = single_node(op, inputs, opset, n_out, **attrs)
    want = ort.InferenceSession(model.SerializeToString()).run(None, dict(zip(inputs, feeds)))
    for g, w in zip(run_model(model, feeds), want):
        assert_same(g, w)


def test_old_attribute_forms():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert fn("Reshape", 1)(x, shape=[4, 0, -1]).shape == (4, 3, 2)
    assert torch.equal(fn("Tile", 1)(x, torch.tensor(3), torch.tensor(-1)), x.repeat(1, 1, 3))
    assert torch.equal(fn("Concat", 1)(x, x), torch.cat([x, x], 1))
    assert torch.equal(fn("Pad", 1)(x, paddings=[0, 0, 1, 0, 0, 0], value=2.0)[:, :, 0], torch.full((2, 3), 2.0))
    assert [p.shape[2] for p in fn("Split", 1)(x, torch.tensor([1, 3]), axis=2, n_outputs=2)] == [1, 3]
    assert [p.shape[2] for p in fn("Split", 1)(x, axis=2, split=[3, 1], n_outputs=2)] == [3, 1]
    assert [p.shape[1] for p in fn("Split", 13)(x, torch.zeros(0, dtype=torch.long), axis=1, n_outputs=3)] == [1] * 3
    assert fn("Reshape", 14)(torch.zeros(0, 3), torch.tensor([3, 0]), allowzero=1).shape == (3, 0)


def test_constant_attribute_forms():
    c = fn("Constant", 13)
    dev = torch.device("cpu")
    assert c(value_float=2.5, device=dev).dtype == torch.float32
    assert torch.equal(c(value_ints=[1, -2], device=dev), torch.tensor([1, -2]))
    assert c(value_int=3, device=dev).shape == ()
    with pytest.raises(UnsupportedOpError):
        c(value_string="hi", device=dev)
    with pytest.raises(OnnxGradError):
        c(value_int=1, value_float=1.0, device=dev)


def test_bad_attribute_values_raise():
    x = torch.zeros(2, 3)
    with pytest.raises(UnsupportedOpError):
        fn("Pad", 18)(x, torch.tensor([1, 1, 1, 1]), mode="mirror")
    with pytest.raises(UnsupportedOpError):
        fn("ScatterElements", 18)(x, torch.zeros(1, 1, dtype=torch.long), x[:1, :1], reduction="avg")
    with pytest.raises(UnsupportedOpError):
        fn("DepthToSpace", 13)(torch.zeros(1, 4, 1, 1), blocksize=2, mode="XYZ")
    with pytest.raises(OnnxGradError):
        fn("Reshape", 14)(x, torch.tensor([4, -1]))
    with pytest.raises(OnnxGradError):
        fn("Slice", 13)(x, torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.tensor([0]))


def test_sequence_ops():
    a, b, c = torch.ones(2, 3), torch.zeros(2, 3), torch.full((2, 3), 2.0)
    seq = fn("SequenceConstruct", 11)(a, b)
    seq2 = fn("SequenceInsert", 11)(seq, c, torch.tensor(-1))
    assert len(seq) == 2 and [t[0, 0].item() for t in seq2] == [1.0, 2.0, 0.0]
    assert fn("SequenceAt", 11)(seq2, torch.tensor(-3)) is a
    assert len(fn("SequenceErase", 11)(seq2)) == 2 and len(seq2) == 3
    assert int(fn("SequenceLength", 11)(fn("SequenceEmpty", 11)(), device=torch.device("cpu"))) == 0
    assert fn("ConcatFromSequence", 11)(seq2, axis=-1, new_axis=1).shape == (2, 3, 3)
    assert fn("ConcatFromSequence", 11)(seq2, axis=0).shape == (6, 3)
    parts = fn("SplitToSequence", 11)(torch.arange(7.0), torch.tensor(3))
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [p.shape for p in fn("SplitToSequence", 11)(torch.zeros(2, 3), axis=1, keepdims=0)] == [(2,)] * 3
    with pytest.raises(OnnxGradError):
        fn("SequenceAt", 11)(seq, torch.tensor(2))


# --- gradients ---------------------------------------------------------------------------------

GRADCHECKS = {
    "Gather": lambda x: fn("Gather")(x, torch.tensor([[2, -1], [0, 0]]), axis=1),
    "GatherElements": lambda x: fn("GatherElements")(x, torch.tensor([[[1, -1, 0, 0]]]), axis=1),
    "GatherND": lambda x: fn("GatherND")(x, torch.tensor([[[1], [-1]], [[0], [0]], [[2], [1]]]), batch_dims=1),
    "Slice-negstep": lambda x: fn("Slice")(x, torch.tensor([-1, 3]), torch.tensor([-2**63, 0]),
                                           torch.tensor([0, 2]), torch.tensor([-2, -2])),
    "Pad-reflect": lambda x: fn("Pad")(x, torch.tensor([0, 2, 3, 1, 0, 5]), mode="reflect"),
    "Pad-edge-crop": lambda x: fn("Pad")(x, torch.tensor([-1, 2, 0, 0, 1, -2]), mode="edge"),
    "Pad-wrap": lambda x: fn("Pad")(x, torch.tensor([4, 1]), None, torch.tensor([2]), mode="wrap"),
    "Pad-constant-value": lambda x: fn("Pad")(x, torch.tensor([1, 0, 0, 0, 0, 2]), x[0, 0, 0]),
    "Expand": lambda x: fn("Expand")(x[:, :1], torch.tensor([2, 3, 3, 1])),
    "Concat": lambda x: fn("Concat")(x, x[:, 1:] * 2, axis=1),
    "Split": lambda x: fn("Split", 18)(x, num_outputs=2, axis=2, n_outputs=2)[1],
    "Transpose": lambda x: fn("Transpose")(x, perm=[2, 0, 1]),
    "Tile": lambda x: fn("Tile")(x, torch.tensor([2, 1, 2])),
    "ScatterElements-add": lambda x: fn("ScatterElements", 18)(x, torch.tensor([[[0, 0, -1]]]), x[:1, :1, :3] ** 2,
                                                               axis=2, reduction="add"),
    "ScatterND-max": lambda x: fn("ScatterND", 18)(x, torch.tensor([[1, 2]]), x[:1, 0] * 3, reduction="max"),
    "ScatterND": lambda x: fn("ScatterND", 18)(x, torch.tensor([[-1]]), x[:1] * 3),
    "ReverseSequence": lambda x: fn("ReverseSequence")(x, torch.tensor([1, 3, 2]), batch_axis=1, time_axis=0),
    "DepthToSpace": lambda x: fn("DepthToSpace")(x.reshape(1, 4, 3, 3), blocksize=2),
    "SpaceToDepth": lambda x: fn("SpaceToDepth", 28)(x.reshape(1, 1, 6, 6), blocksize=2, mode="CRD"),
    "Trilu": lambda x: fn("Trilu")(x, torch.tensor(1), upper=0),
    "Compress": lambda x: fn("Compress")(x, torch.tensor([True, False, True])),
    "CenterCropPad": lambda x: fn("CenterCropPad")(x, torch.tensor([1, 4, 7])),
    "OneHot-values": lambda x: fn("OneHot")(torch.tensor([1, 0, 3]), torch.tensor(4), x[0, 0, :2]),
    "Unique-Y": lambda x: fn("Unique")(x, sorted=0, n_outputs=1)[0],
    "Range-start-delta": lambda x: fn("Range", 27)(x[0, 0, 0].clamp(0, 1), torch.tensor(5.0, dtype=x.dtype),
                                                   x[0, 0, 1].abs() + 1),
    "Flatten+Unsqueeze+Squeeze": lambda x: fn("Squeeze")(fn("Unsqueeze")(fn("Flatten")(x), torch.tensor([0, -1]))),
}


GRAD_SHAPES = {"Trilu": (2, 4, 5), "ReverseSequence": (4, 3, 2)}


@pytest.mark.parametrize("name", sorted(GRADCHECKS))
def test_gradcheck(name):
    torch.manual_seed(0)
    x = torch.randn(GRAD_SHAPES.get(name, (3, 3, 4)), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(GRADCHECKS[name], (x,))


# --- vmap over a leading batch dim of the data (how the verifier batches perturbations) -----------

VMAPPED = {
    "Gather": lambda x: fn("Gather")(x, torch.tensor([-1, 0]), axis=-1),
    "Slice": lambda x: fn("Slice")(x, torch.tensor([-1]), torch.tensor([0]), torch.tensor([-1]), torch.tensor([-1])),
    "Pad": lambda x: fn("Pad")(x, torch.tensor([1, 2, 0, 3]), mode="reflect"),
    "Pad-constant": lambda x: fn("Pad")(x, torch.tensor([1, 2, 0, 3]), torch.tensor(1.5, dtype=x.dtype)),
    "Concat": lambda x: fn("Concat")(x, x, axis=-1),
    "Expand": lambda x: fn("Expand")(x, torch.tensor([2, 1, 1])),
    "Reshape": lambda x: fn("Reshape")(x, torch.tensor([0, -1, 1])),
    "Transpose": lambda x: fn("Transpose")(x),
    "GatherElements": lambda x: fn("GatherElements")(x, torch.tensor([[0, -1]]), axis=1),
    "GatherND": lambda x: fn("GatherND")(x, torch.tensor([[1, -1]])),
    "ScatterND": lambda x: fn("ScatterND", 18)(x, torch.tensor([[0]]), x[:1] * 2, reduction="add"),
    "ScatterElements": lambda x: fn("ScatterElements", 18)(x, torch.tensor([[1]]), x[:1, :1] + 1, axis=1),
    "Split": lambda x: fn("Split", 18)(x, torch.tensor([1, 3]), axis=1, n_outputs=2)[1],
    "Tile": lambda x: fn("Tile")(x, torch.tensor([2, 2])),
    "Trilu": lambda x: fn("Trilu")(x),
    "Flatten": lambda x: fn("Flatten")(x, axis=0),
    "Unsqueeze": lambda x: fn("Unsqueeze")(x, torch.tensor([-1])),
    "Shape": lambda x: x * fn("Shape")(x, start=-1).to(x.dtype),
}


@pytest.mark.parametrize("name", sorted(VMAPPED))
def test_vmap_matches_loop(name):
    f = VMAPPED[name]
    xs = torch.randn(5, 3, 4, dtype=torch.float64)
    want = torch.stack([f(x) for x in xs])
    torch.testing.assert_close(torch.func.vmap(f)(xs), want)
