"""Elementwise, activation and reduction ops: ONNX node cases, older opsets, gradients, vmap."""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import engine
from engine.errors import OnnxGradError, UnsupportedOpError
from engine.registry import lookup

MINE = frozenset("""
Add Sub Mul Div Pow Neg Abs Sign Reciprocal Sqrt Exp Log Floor Ceil Round Mod Min Max Sum Mean Erf
Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh IsNaN IsInf BitShift BitwiseAnd BitwiseOr
BitwiseXor BitwiseNot Relu LeakyRelu PRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Tanh Softplus
Softsign ThresholdedRelu Shrink Gelu Mish Swish Clip Equal Less LessOrEqual Greater GreaterOrEqual
And Or Xor Not Where Cast CastLike Identity ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd
ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare ArgMax ArgMin CumSum CumProd Softmax
LogSoftmax Hardmax TopK
""".split())

# Element types torch (and so the engine) cannot hold.
EXOTIC = {getattr(TensorProto, n) for n in (
    "STRING", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0",
    "UINT4", "INT4", "FLOAT4E2M1", "UINT2", "INT2") if hasattr(TensorProto, n)}


def _collect():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    out = []
    for c in cases:
        ops = {n.op_type for n in c.model.graph.node}
        if ops & MINE and ops <= MINE | {"Constant"}:
            out.append(c)
    return out


CASES = _collect()


def _skip_reason(case):
    graph = case.model.graph
    for vi in list(graph.input) + list(graph.output):
        if not vi.type.HasField("tensor_type"):
            return "sequence/optional values are fed and returned by the interpreter, not the op"
        if vi.type.tensor_type.elem_type in EXOTIC:
            return f"{TensorProto.DataType.Name(vi.type.tensor_type.elem_type)} has no torch dtype here"
    for node in graph.node:
        for a in node.attribute:
            if a.name == "to" and a.i in EXOTIC:
                return f"Cast to {TensorProto.DataType.Name(a.i)}: no torch dtype here"
    return None


def _array(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v)


def _assert_matches(got, want, rtol, atol, what):
    if want.dtype.kind in "fc" or str(want.dtype) == "bfloat16":
        assert got.dtype == want.dtype or str(want.dtype) == "bfloat16", what
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=what)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape)
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    reason = _skip_reason(case)
    if reason:
        pytest.skip(reason)
    model = engine.load(case.model)
    names = [i.name for i in case.model.graph.input]
    outs = [o.name for o in case.model.graph.output]
    for inputs, expected in case.data_sets:
        got = model.run({n: _array(v) for n, v in zip(names, inputs)})
        for name, want in zip(outs, expected):
            _assert_matches(got[name], _array(want), case.rtol or 1e-3, case.atol or 1e-7, f"{case.name}:{name}")


def test_node_cases_cover_every_op():
    covered = {n.op_type for c in CASES for n in c.model.graph.node}
    assert not MINE - covered, f"ops without a shipped node case: {sorted(MINE - covered)}"


# --- older opsets, against onnxruntime or a direct numpy formula -------------------------------

_NP = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
       np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
       np.dtype(np.uint64): TensorProto.UINT64, np.dtype(np.uint32): TensorProto.UINT32,
       np.dtype(np.bool_): TensorProto.BOOL}


def _single(op, opset, inputs, out_types, **attrs):
    names = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
    node = helper.make_node(op, names, [f"out{k}" for k in range(len(out_types))], **attrs)
    ins = [helper.make_tensor_value_info(n, _NP[v.dtype], v.shape) for n, v in zip(names, inputs) if v is not None]
    outs = [helper.make_tensor_value_info(f"out{k}", t, None) for k, t in enumerate(out_types)]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    return model, {n: v for n, v in zip(names, inputs) if v is not None}


def _ours(model, feeds):
    got = engine.load(model, check=False).run(feeds)
    return [got[o.name] for o in model.graph.output]


def _ort(model, feeds):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


RNG = np.random.default_rng(0)
X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_softmax_family_coerces_to_2d_before_13(op, opset, axis):
    kw = {} if axis is None else {"axis": axis}
    model, feeds = _single(op, opset, [X3], [TensorProto.FLOAT], **kw)
    want = _ort(model, feeds)[0]
    np.testing.assert_allclose(_ours(model, feeds)[0], want, rtol=1e-5, atol=1e-6)
    if op == "Softmax" and axis == 1:  # normalised over the 12 trailing values, not the 3 of axis 1
        np.testing.assert_allclose(want.reshape(2, -1).sum(1), [1, 1], rtol=1e-5)


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [1, 11, 13])
def test_reductions_with_axes_attribute(op, opset):
    if op == "ReduceSum" and opset == 13:
        pytest.skip("ReduceSum takes axes as an input from opset 13")
    x = np.abs(X3) + 0.1 if op == "ReduceLogSum" else X3
    for axes in ([None, [1], [0, 2]] + ([[-1]] if opset >= 11 else [])):
        for keepdims in (0, 1):
            kw = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
            model, feeds = _single(op, opset, [x], [TensorProto.FLOAT], **kw)
            np.testing.assert_allclose(_ours(model, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{op} axes={axes} keepdims={keepdims}")


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes_keeps_the_element_map(op):
    # onnxruntime and the reference agree: reducing over no axes still applies abs/square/log...
    x = np.abs(X3) + 0.1
    axes = np.zeros(0, np.int64)
    model, feeds = _single(op, 18, [x, axes], [TensorProto.FLOAT], noop_with_empty_axes=1)
    np.testing.assert_allclose(_ours(model, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


def _check(op, opset, inputs, want, **attrs):
    model, feeds = _single(op, opset, inputs, [_NP[np.asarray(w).dtype] for w in want], **attrs)
    for g, w in zip(_ours(model, feeds), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{op}-{opset} {attrs}")


def test_legacy_broadcast_before_opset_7():
    b3, b4 = X3[0, :, 0].copy(), X3[0, 0].copy()
    _check("Add", 6, [X3, b3], [X3 + b3[:, None]], broadcast=1, axis=1)
    _check("Sub", 6, [X3, b4], [X3 - b4], broadcast=1)
    _check("Mul", 1, [X3, b3[:2].copy()], [X3 * b3[:2, None, None]], broadcast=1, axis=0)
    _check("Div", 6, [X3, X3], [np.ones_like(X3)])
    _check("Pow", 1, [np.abs(X3), b4], [np.abs(X3) ** b4], broadcast=1)
    _check("Less", 1, [X3, b3], [X3 < b3[:, None]], broadcast=1, axis=1)
    _check("And", 1, [X3 > 0, b4 > 0], [(X3 > 0) & (b4 > 0)], broadcast=1)


def test_old_activation_and_clip_versions():
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    _check("PRelu", 6, [X3, slope], [np.where(X3 > 0, X3, X3 * slope[None, :, None])])
    _check("Selu", 1, [X3], [1.0507 * np.where(X3 > 0, X3, 1.6732 * np.expm1(X3))])
    _check("Clip", 6, [X3], [np.clip(X3, -0.5, 0.3)], min=-0.5, max=0.3)
    _check("Clip", 1, [X3], [np.minimum(X3, 0.3)], max=0.3)
    _check("Clip", 11, [X3, None, np.array(0.2, np.float32)], [np.minimum(X3, 0.2)])
    _check("Cast", 1, [X3], [X3.astype(np.int64)], to="INT64")


def test_topk_versions_against_reference():
    for opset, inputs, attrs in [(1, [X3], {"k": 2, "axis": 1}),
                                 (10, [X3, np.array([3], np.int64)], {}),
                                 (11, [X3, np.array([2], np.int64)], {"largest": 0, "axis": 0})]:
        model, feeds = _single("TopK", opset, inputs, [TensorProto.FLOAT, TensorProto.INT64], **attrs)
        for g, w in zip(_ours(model, feeds), ReferenceEvaluator(model).run(None, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_bitshift_unsigned_right_shift_is_logical():
    x = np.array([2**63 + 8, 16, 3], np.uint64)
    _check_exact("BitShift", 11, [x, np.array([2, 1, 0], np.uint64)], x >> np.array([2, 1, 0], np.uint64),
                 direction="RIGHT")
    x = np.array([2**31 + 8, 16, 3], np.uint32)
    _check_exact("BitShift", 11, [x, np.array([2, 1, 31], np.uint32)], x << np.array([2, 1, 31], np.uint32),
                 direction="LEFT")


def _check_exact(op, opset, inputs, want, **attrs):
    model, feeds = _single(op, opset, inputs, [_NP[want.dtype]], **attrs)
    np.testing.assert_array_equal(_ours(model, feeds)[0], want)


def test_unsupported_attribute_values_raise():
    x = torch.randn(3)
    with pytest.raises(UnsupportedOpError, match="approximate"):
        fn("Gelu")(x, approximate="erf")
    with pytest.raises(UnsupportedOpError, match="direction"):
        fn("BitShift")(torch.tensor([1]), torch.tensor([1]), direction="UP")
    with pytest.raises(OnnxGradError, match="FLOAT8E4M3FN"):
        fn("Cast")(x, to=TensorProto.FLOAT8E4M3FN)
    with pytest.raises(OnnxGradError, match="unknown target type"):
        fn("Cast", 1)(x, to="QUATERNION")


# --- gradients ---------------------------------------------------------------------------------

def fn(op, opset=30):
    impl = lookup("", op, opset)
    assert impl is not None, f"{op} opset {opset} is not registered"
    return impl.fn


_Y = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
_AX = torch.tensor([1, -1])
_F64 = dict(dtype=torch.float64)

DIFFERENTIABLE = {
    "Selu": lambda x: fn("Selu")(x),
    "Celu": lambda x: fn("Celu")(x, alpha=0.7),
    "Gelu_tanh": lambda x: fn("Gelu")(x, approximate="tanh"),
    "Gelu": lambda x: fn("Gelu")(x),
    "Mish": lambda x: fn("Mish")(x),
    "Softsign": lambda x: fn("Softsign")(x),
    "Swish": lambda x: fn("Swish")(x, alpha=0.8),
    "ReduceL2": lambda x: fn("ReduceL2")(x, _AX, keepdims=0),
    "ReduceLogSumExp": lambda x: fn("ReduceLogSumExp")(x, _AX),
    "ReduceProd": lambda x: fn("ReduceProd")(x, _AX, keepdims=0),
    "ReduceMean_13": lambda x: fn("ReduceMean", 13)(x, axes=[0, 2]),
    "Softmax_11": lambda x: fn("Softmax", 11)(x, axis=1),
    "LogSoftmax_11": lambda x: fn("LogSoftmax", 11)(x, axis=2),
    "LogSoftmax": lambda x: fn("LogSoftmax")(x, axis=0),
    "CumProd": lambda x: fn("CumProd")(x, torch.tensor(1), exclusive=1, reverse=1),
    "CumSum": lambda x: fn("CumSum")(x, torch.tensor(-1), exclusive=1),
    "TopK": lambda x: fn("TopK")(x, torch.tensor([2]), axis=1)[0],
    "Mod": lambda x: fn("Mod")(3 * x, torch.tensor(1.7, **_F64)),
    "Pow": lambda x: fn("Pow")(x.abs() + 0.5, _Y),
    "Div": lambda x: fn("Div")(x, _Y + 3),
    "Clip": lambda x: fn("Clip")(x, torch.tensor(-0.5, **_F64), torch.tensor(0.5, **_F64)),
    "PRelu": lambda x: fn("PRelu")(x, _Y),
    "Where": lambda x: fn("Where")(x > 0, x, _Y),
    "Mean": lambda x: fn("Mean")(x, _Y, _Y),
    "Atanh": lambda x: fn("Atanh")(torch.tanh(x)),
}


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradcheck_float64(name):
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    assert torch.autograd.gradcheck(DIFFERENTIABLE[name], (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_vmap_over_a_leading_batch_dim(name):
    f = DIFFERENTIABLE[name]
    xb = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(torch.func.vmap(f)(xb), torch.stack([f(x) for x in xb]))


def _grad(f, *xs):
    xs = [x.clone().requires_grad_(True) for x in xs]
    return torch.autograd.grad(f(*xs).sum(), xs)


def test_kink_conventions():
    z = torch.zeros(1, **_F64)
    assert _grad(fn("Relu"), z)[0].item() == 0.0
    assert _grad(fn("Abs"), z)[0].item() == 0.0
    assert _grad(lambda x: fn("LeakyRelu")(x, alpha=0.1), z)[0].item() == pytest.approx(0.1)
    assert [g.item() for g in _grad(fn("Max"), z, z)] == [0.5, 0.5]
    assert _grad(lambda x: fn("Clip")(x, torch.tensor(0.0, **_F64)), z)[0].item() == 1.0
    tie = torch.tensor([1.0, 3.0, 3.0], **_F64)
    assert _grad(lambda x: fn("ReduceMax")(x), tie)[0].tolist() == [0.0, 0.5, 0.5]
    assert _grad(lambda x: fn("ReduceL2")(x), torch.zeros(3, **_F64))[0].tolist() == [0.0, 0.0, 0.0]


# --- properties against torch written directly --------------------------------------------------

@st.composite
def broadcast_pair(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    other = [draw(st.sampled_from([1, n])) for n in shape][draw(st.integers(0, len(shape))):]
    return shape, other


BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
          "Max": torch.maximum, "Min": torch.minimum, "Pow": lambda a, b: torch.pow(a.abs() + 0.5, b)}


@settings(max_examples=30, deadline=None)
@given(broadcast_pair(), st.sampled_from(sorted(BINARY)), st.booleans(), st.integers(0, 2**31))
def test_binary_broadcast_values_and_grads(shapes, op, swap, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(s, generator=g, **_F64) + 0.1 for s in (shapes if not swap else shapes[::-1]))
    if op == "Div":
        b = b.sign() * (b.abs() + 0.5)
    ours = fn(op) if op != "Pow" else (lambda x, y: fn("Pow")(x.abs() + 0.5, y))
    torch.testing.assert_close(ours(a, b), BINARY[op](a, b))
    for got, want in zip(_grad(ours, a, b), _grad(BINARY[op], a, b)):
        torch.testing.assert_close(got, want)


@st.composite
def tensor_and_axes(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape), unique=True))
    if len({a % len(shape) for a in axes}) != len(axes):
        axes = axes[:1]
    return shape, axes, draw(st.booleans())


DIRECT = {
    "ReduceSum": lambda x, d, k: x.sum(d, keepdim=k),
    "ReduceMean": lambda x, d, k: x.mean(d, keepdim=k),
    "ReduceL1": lambda x, d, k: x.abs().sum(d, keepdim=k),
    "ReduceL2": lambda x, d, k: (x * x).sum(d, keepdim=k).sqrt(),
    "ReduceLogSum": lambda x, d, k: x.sum(d, keepdim=k).log(),
    "ReduceLogSumExp": lambda x, d, k: x.exp().sum(d, keepdim=k).log(),
    "ReduceSumSquare": lambda x, d, k: (x * x).sum(d, keepdim=k),
    "ReduceMax": lambda x, d, k: x.amax(d, keepdim=k),
    "ReduceMin": lambda x, d, k: x.amin(d, keepdim=k),
}


@settings(max_examples=40, deadline=None)
@given(tensor_and_axes(), st.sampled_from(sorted(DIRECT) + ["ReduceProd"]), st.integers(0, 2**31))
def test_reductions_random_axes(spec, op, seed):
    shape, axes, keep = spec
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), **_F64)
    x = x.exp() if op == "ReduceLogSum" else x
    dims = sorted({a % len(shape) for a in axes}) or list(range(len(shape)))
    ours = lambda t: fn(op)(t, torch.tensor(axes, dtype=torch.int64), keepdims=int(keep))  # noqa: E731
    if op == "ReduceProd":
        want = np.prod(x.numpy(), axis=tuple(dims), keepdims=keep)
        np.testing.assert_allclose(ours(x).numpy(), want, rtol=1e-12)
        return
    direct = lambda t: DIRECT[op](t, dims, keep)  # noqa: E731
    torch.testing.assert_close(ours(x), direct(x))
    torch.testing.assert_close(_grad(ours, x)[0], _grad(direct, x)[0])


@settings(max_examples=30, deadline=None)
@given(tensor_and_axes(), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_cumsum_and_softmax_axes(spec, exclusive, reverse, seed):
    shape, axes, _ = spec
    axis = axes[0] if axes else -1
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), **_F64)
    flip = (lambda t: t.flip(axis)) if reverse else (lambda t: t)  # noqa: E731
    incl = flip(flip(x).cumsum(axis))
    torch.testing.assert_close(fn("CumSum")(x, torch.tensor(axis), exclusive=int(exclusive), reverse=int(reverse)),
                               incl - x if exclusive else incl)
    torch.testing.assert_close(fn("Softmax")(x, axis=axis), torch.softmax(x, axis))
    d = axis % len(shape)
    rows = int(np.prod(shape[:d]))
    torch.testing.assert_close(fn("LogSoftmax", 11)(x, axis=axis),
                               torch.log_softmax(x.reshape(rows, -1), 1).reshape(shape))
    top = fn("TopK")(x, torch.tensor([1]), axis=axis)
    torch.testing.assert_close(top[0], x.amax(axis, keepdim=True))
    torch.testing.assert_close(top[1], x.argmax(axis, keepdim=True))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=8), st.floats(0.25, 20), st.booleans())
def test_mod_matches_python_semantics(values, divisor, negative):
    b = -divisor if negative else divisor
    a = torch.tensor(values, **_F64)
    got = fn("Mod")(a, torch.tensor(b, **_F64))
    want = torch.tensor([np.mod(v, b) for v in values], **_F64)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(fn("Mod")(a, torch.tensor(b, **_F64), fmod=1), torch.tensor(np.fmod(values, b)))
