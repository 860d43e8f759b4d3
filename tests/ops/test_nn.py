"""NN ops (matmul, conv, pool, normalization, dropout, resize, RNNs): ONNX node cases, variants
against onnxruntime, and values / gradients against torch written directly."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import engine
from engine.errors import OnnxGradError, UnsupportedOpError
from engine.registry import lookup

MINE = frozenset("""
MatMul MatMulInteger Gemm Einsum Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool
GlobalLpPool LpPool LRN BatchNormalization InstanceNormalization LayerNormalization GroupNormalization
MeanVarianceNormalization LpNormalization Dropout Resize Upsample RNN GRU LSTM
""".split())


def _collect():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    own = {c.name for c in cases if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in MINE}
    return [c for c in cases if c.name in own or (c.name.endswith("_expanded") and c.name[:-9] in own)]


CASES = _collect()


def _check(got, want, rtol, atol, what):
    want = np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)
    else:
        if str(want.dtype) == "bfloat16":
            rtol = max(rtol, 2.0**-6)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_case(case):
    try:
        model = engine.load(case.model, check=False)
    except UnsupportedOpError as exc:
        if {n.op_type for n in case.model.graph.node} <= MINE:
            raise
        pytest.skip(f"needs another family's op: {exc}"[:200])
    names = [i.name for i in case.model.graph.input]
    outs = [o.name for o in case.model.graph.output]
    rtol = getattr(case, "rtol", None) or 1e-3
    atol = getattr(case, "atol", None) or 1e-7
    for inputs, expected in case.data_sets:
        got = model.run({n: np.asarray(v) for n, v in zip(names, inputs)}, outputs=outs[: len(expected)])
        for name, want in zip(outs, expected):
            _check(got[name], want, rtol, atol, f"{case.name}:{name}")


# --- attribute variants the node cases miss, against onnxruntime ---------------------------------

_ELEM = {np.dtype(k): v for k, v in [("float32", TensorProto.FLOAT), ("int64", TensorProto.INT64),
                                      ("int32", TensorProto.INT32), ("uint8", TensorProto.UINT8)]}


def single_node(op, inputs, opset, out_names, **attrs):
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    node = helper.make_node(op, names, out_names, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, _ELEM[v.dtype], None) for n, v in zip(names, inputs) if n],
        [onnx.ValueInfoProto(name=o) for o in out_names if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, {n: v for n, v in zip(names, inputs) if n}


def check_against_ort(op, inputs, opset, n_outputs=1, out_names=None, rtol=1e-4, atol=1e-5, **attrs):
    out_names = out_names or [f"y{k}" for k in range(n_outputs)]
    model, feeds = single_node(op, inputs, opset, out_names, **attrs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = engine.load(model, check=False).run(feeds)
    for name, w in zip([o for o in out_names if o], want):
        _check(got[name], w, rtol, atol, f"{op}:{name}")


R = np.random.default_rng(0)


def rnd(*shape, scale=1.0):
    return (R.standard_normal(shape) * scale).astype(np.float32)


X = rnd(2, 3, 7, 8)
E = np.array([], np.float32)
VARIANTS = [
    ("MaxPool", [X], 12, 2, dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1)),
    ("MaxPool", [X], 12, 2, dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], storage_order=1)),
    ("MaxPool", [rnd(1, 2, 5, 6, 7)], 12, 2, dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], ceil_mode=1,
                                                  pads=[0, 1, 1, 1, 0, 1])),
    ("AveragePool", [X], 19, 1, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0], ceil_mode=1,
                                     count_include_pad=1)),
    ("AveragePool", [X], 19, 1, dict(kernel_shape=[3, 2], strides=[2, 3], dilations=[2, 2], pads=[2, 1, 0, 1],
                                     ceil_mode=1)),
    ("AveragePool", [X], 11, 1, dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER",
                                     count_include_pad=1)),
    ("LpPool", [X], 18, 1, dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 0, 1], p=3)),
    ("GlobalLpPool", [X], 11, 1, dict(p=3)),
    ("Conv", [X, rnd(6, 3, 3, 2), rnd(6)], 11, 1, dict(pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])),
    ("Conv", [X, rnd(6, 1, 3, 3), rnd(6)], 11, 1, dict(group=3, auto_pad="SAME_LOWER", strides=[2, 2])),
    ("Conv", [rnd(1, 2, 5, 6, 7), rnd(3, 2, 2, 3, 2)], 11, 1, dict(pads=[1, 0, 1, 0, 1, 1], strides=[2, 1, 2])),
    ("ConvTranspose", [X, rnd(3, 2, 3, 3), rnd(6)], 11, 1, dict(group=3, strides=[2, 3], pads=[1, 0, 0, 2],
                                                               output_padding=[1, 2])),
    ("ConvTranspose", [X, rnd(3, 4, 3, 2), rnd(4)], 11, 1, dict(strides=[2, 2], dilations=[2, 1],
                                                               pads=[1, 1, 1, 0])),
    ("ConvTranspose", [X, rnd(3, 4, 3, 3)], 11, 1, dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ("ConvTranspose", [X, rnd(3, 4, 3, 3)], 11, 1, dict(strides=[2, 2], output_shape=[15, 18])),
    ("Resize", [X, E, np.array([1, 1, 1.7, 0.6], np.float32)], 13, 1,
     dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel")),
    ("Resize", [X, E, E, np.array([2, 3, 9, 4], np.int64)], 13, 1,
     dict(mode="linear", coordinate_transformation_mode="align_corners")),
    ("Resize", [X, E, np.array([1, 1, 0.5, 2.25], np.float32)], 13, 1,
     dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil")),
    ("Resize", [X, E, np.array([1, 1, 0.6, 1.8], np.float32)], 13, 1,
     dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)),
    ("Resize", [X, np.array([0, 0, -0.2, 0.1, 1, 1, 1.3, 0.7], np.float32), E, np.array([2, 3, 4, 6], np.int64)],
     13, 1, dict(mode="nearest", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0)),
    ("Resize", [X, E, np.array([1, 1, 0.45, 0.6], np.float32)], 18, 1, dict(mode="cubic", antialias=1)),
    ("Resize", [X, E, E, np.array([3, 4], np.int64)], 18, 1,
     dict(mode="linear", antialias=1, axes=[2, 3], keep_aspect_ratio_policy="not_larger")),
    ("Resize", [np.arange(120, dtype=np.uint8).reshape(2, 3, 4, 5), E, np.array([1, 1, 1.5, 2], np.float32)],
     13, 1, dict(mode="nearest")),
    ("Resize", [rnd(1, 2, 5, 4), np.array([1, 1, 0.6, 1.5], np.float32)], 10, 1, dict(mode="nearest")),
    ("Resize", [rnd(1, 2, 4, 4), np.array([1, 1, 2.5, 0.5], np.float32)], 10, 1, dict(mode="linear")),
    ("Upsample", [rnd(1, 2, 4, 4)], 7, 1, dict(mode="linear", scales=[1.0, 1.0, 2.0, 2.0])),
    ("Upsample", [rnd(1, 2, 4, 4), np.array([1, 1, 2, 3], np.float32)], 9, 1, dict(mode="nearest")),
    ("BatchNormalization", [X, rnd(3, 7, 8), rnd(3, 7, 8), rnd(3, 7, 8), np.abs(rnd(3, 7, 8))], 7, 1,
     dict(spatial=0)),
    ("BatchNormalization", [X, rnd(3), rnd(3), rnd(3), np.abs(rnd(3))], 9, 5, {}),
    ("BatchNormalization", [X, rnd(3), rnd(3), rnd(3), np.abs(rnd(3))], 15, 3, dict(training_mode=1)),
    ("Gemm", [rnd(3, 4), rnd(5, 4), rnd(5)], 7, 1, dict(transB=1, alpha=0.5, beta=2.0)),
    ("Gemm", [rnd(4, 3), rnd(4, 5), rnd(3, 1)], 11, 1, dict(transA=1)),
    ("MatMulInteger", [R.integers(0, 255, (2, 4, 3)).astype(np.uint8), R.integers(0, 255, (3, 5)).astype(np.uint8),
                       np.array(12, np.uint8), np.array(7, np.uint8)], 10, 1, {}),
    ("LRN", [X], 13, 1, dict(size=5, alpha=0.01, beta=0.6, bias=2.0)),
    ("GroupNormalization", [X, rnd(3), rnd(3)], 21, 1, dict(num_groups=3)),
    ("MeanVarianceNormalization", [X], 13, 1, dict(axes=[1, 3])),
    ("LayerNormalization", [X, rnd(7, 8), rnd(8)], 17, 3, dict(axis=2)),
    ("Einsum", [rnd(2, 3, 4), rnd(2, 4, 5)], 12, 1, dict(equation="bij, bjk -> bik")),
    ("Einsum", [rnd(2, 3, 4, 5)], 12, 1, dict(equation="...ij->...ji")),
]


def _rnn_variants():
    out = []
    T, B, I, H = 5, 3, 4, 6
    for op, gates, n_out in (("RNN", 1, 2), ("GRU", 3, 2), ("LSTM", 4, 3)):
        for direction in ("forward", "reverse", "bidirectional"):
            D = 2 if direction == "bidirectional" else 1
            ins = [rnd(T, B, I, scale=0.5), rnd(D, gates * H, I, scale=0.5), rnd(D, gates * H, H, scale=0.5),
                   rnd(D, 2 * gates * H, scale=0.5), np.array([5, 3, 1], np.int32), rnd(D, B, H)]
            if op == "LSTM":
                ins += [rnd(D, B, H), rnd(D, 3 * H)]
            extra = dict(linear_before_reset=1) if op == "GRU" and direction == "reverse" else {}
            out.append((op, ins, 14, n_out, dict(hidden_size=H, direction=direction, **extra)))
        acts = {"RNN": ["LeakyRelu", "ScaledTanh"], "GRU": ["HardSigmoid", "Affine", "Sigmoid", "Elu"],
                "LSTM": ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "ScaledTanh", "Relu"]}[op]
        n_alpha = sum(a in ("LeakyRelu", "ScaledTanh", "HardSigmoid", "Affine", "Elu") for a in acts)
        n_beta = sum(a in ("ScaledTanh", "HardSigmoid", "Affine") for a in acts)
        ins = [rnd(T, B, I), rnd(2, gates * H, I), rnd(2, gates * H, H), rnd(2, 2 * gates * H)]
        out.append((op, ins, 14, n_out, dict(hidden_size=H, direction="bidirectional", activations=acts,
                                             activation_alpha=[0.3, 0.7, 1.1, 0.4][:n_alpha],
                                             activation_beta=[0.2, 0.6, 0.1][:n_beta], clip=0.8)))
    ins = [rnd(T, B, I), rnd(1, 4 * H, I), rnd(1, 4 * H, H), rnd(1, 8 * H)]
    out.append(("LSTM", ins, 7, 3, dict(hidden_size=H, input_forget=1)))
    return out


VARIANTS += _rnn_variants()


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"{v[0]}-opset{v[2]}-{i}" for i, v in enumerate(VARIANTS)])
def test_variant_matches_onnxruntime(variant):
    op, inputs, opset, n_out, attrs = variant
    check_against_ort(op, inputs, opset, n_out, **attrs)


def test_rnn_only_hidden_outputs_requested():
    ins = [rnd(4, 2, 3), rnd(2, 24, 3), rnd(2, 24, 6), rnd(2, 48)]
    check_against_ort("LSTM", ins, 14, out_names=["", "h", "c"], hidden_size=6, direction="bidirectional")


# --- semantics onnxruntime does not cover --------------------------------------------------------

def fn(op, opset=22):
    impl = lookup("", op, opset)
    assert impl is not None, f"{op} opset {opset} is not registered"
    return impl.fn


@pytest.mark.parametrize("op,gates,extra", [("RNN", 1, 0), ("GRU", 3, 0), ("LSTM", 4, 2)])
def test_rnn_layout_1_is_the_batch_major_transpose(op, gates, extra):
    torch.manual_seed(0)
    T, B, I, H, D = 4, 3, 2, 5, 2
    x, w, r, b = torch.randn(T, B, I), torch.randn(D, gates * H, I), torch.randn(D, gates * H, H), torch.randn(D, 2 * gates * H)
    h0 = torch.randn(D, B, H)
    lens = torch.tensor([4, 2, 3], dtype=torch.int32)
    states = [h0] + ([torch.randn(D, B, H), torch.randn(D, 3 * H)] if extra else [])
    n = 2 + (extra > 0)
    kw = dict(direction="bidirectional", n_outputs=n)
    y0 = fn(op)(x, w, r, b, lens, *states, layout=0, **kw)
    swapped = [s.transpose(0, 1) if s.dim() == 3 else s for s in states]
    y1 = fn(op)(x.transpose(0, 1), w, r, b, lens, *swapped, layout=1, **kw)
    torch.testing.assert_close(y1[0], y0[0].permute(2, 0, 1, 3))
    for a, c in zip(y1[1:], y0[1:]):
        torch.testing.assert_close(a, c.transpose(0, 1))
    # past a sequence's end Y is zero and the state is frozen
    assert torch.all(y0[0][2:, :, 1] == 0)


def test_lstm_matches_torch_nn_lstm():
    torch.manual_seed(1)
    T, B, I, H = 6, 2, 3, 4
    ref = torch.nn.LSTM(I, H, bidirectional=True).double()
    x = torch.randn(T, B, I, dtype=torch.float64)

    def onnx_weights(suffix):
        w_ih, w_hh = getattr(ref, f"weight_ih_l0{suffix}"), getattr(ref, f"weight_hh_l0{suffix}")
        b_ih, b_hh = getattr(ref, f"bias_ih_l0{suffix}"), getattr(ref, f"bias_hh_l0{suffix}")
        order = lambda t: torch.cat([t.chunk(4)[k] for k in (0, 3, 1, 2)])  # torch ifgo -> onnx iofc
        return order(w_ih), order(w_hh), torch.cat([order(b_ih), order(b_hh)])

    parts = [onnx_weights(""), onnx_weights("_reverse")]
    w, r, b = (torch.stack([p[k] for p in parts]) for k in range(3))
    y, h, c = fn("LSTM")(x, w, r, b, direction="bidirectional", n_outputs=3)
    y_ref, (h_ref, c_ref) = ref(x)
    torch.testing.assert_close(y.permute(0, 2, 1, 3).reshape(T, B, 2 * H), y_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c, c_ref)


def test_gru_matches_torch_nn_gru():
    torch.manual_seed(2)
    T, B, I, H = 5, 3, 2, 4
    ref = torch.nn.GRU(I, H).double()
    x = torch.randn(T, B, I, dtype=torch.float64)
    order = lambda t: torch.cat([t.chunk(3)[k] for k in (1, 0, 2)])  # torch rzn -> onnx zrh
    w, r = order(ref.weight_ih_l0)[None], order(ref.weight_hh_l0)[None]
    b = torch.cat([order(ref.bias_ih_l0), order(ref.bias_hh_l0)])[None]
    y, h = fn("GRU")(x, w, r, b, linear_before_reset=1, n_outputs=2)  # torch's GRU resets after R h
    y_ref, h_ref = ref(x)
    torch.testing.assert_close(y[:, 0], y_ref)
    torch.testing.assert_close(h, h_ref)


def test_maxpool_indices_point_at_the_maxima():
    x = torch.randn(2, 3, 7, 6)
    y, idx = fn("MaxPool")(x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1, n_outputs=2)
    torch.testing.assert_close(x.reshape(-1)[idx], y)


def test_dropout_training_mask_and_scale():
    x = torch.randn(4, 50, dtype=torch.float64)
    y, mask = fn("Dropout")(x, torch.tensor(0.25, dtype=torch.float64), torch.tensor(True), seed=3, n_outputs=2)
    assert mask.dtype == torch.bool and 0 < mask.sum() < mask.numel()
    torch.testing.assert_close(y, torch.where(mask, x / 0.75, torch.zeros_like(x)))
    y2, m2 = fn("Dropout")(x, torch.tensor(0.25), n_outputs=2)  # inference: identity, mask of ones
    assert torch.equal(y2, x) and bool(m2.all())


@pytest.mark.parametrize("call", [
    lambda: fn("Resize")(torch.zeros(1, 1, 2, 2), None, torch.tensor([1.0, 1, 2, 2]), mode="area"),
    lambda: fn("Resize")(torch.zeros(1, 1, 2, 2), None, torch.tensor([1.0, 1, 2, 2]), nearest_mode="banker"),
    lambda: fn("Resize")(torch.zeros(1, 1, 2, 2), None, torch.tensor([1.0, 1, 2, 2]),
                         coordinate_transformation_mode="tf_half_pixel"),
    lambda: fn("Conv")(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 2, 2), auto_pad="SAME"),
    lambda: fn("MaxPool")(torch.zeros(1, 1, 4, 4), kernel_shape=[2, 2], auto_pad="FULL"),
    lambda: fn("RNN")(torch.zeros(2, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), activations=["Gelu"]),
    lambda: fn("LSTM")(torch.zeros(2, 1, 1), torch.zeros(1, 4, 1), torch.zeros(1, 4, 1), direction="both"),
    lambda: fn("LpNormalization")(torch.zeros(2, 2), p=3),
])
def test_unsupported_attribute_values_raise(call):
    with pytest.raises(UnsupportedOpError):
        call()


def test_bad_geometry_is_a_clear_error():
    with pytest.raises(OnnxGradError, match="kernel_shape"):
        fn("AveragePool")(torch.zeros(1, 1, 4, 4), kernel_shape=[2])


# --- gradients: float64 gradcheck, and vmap over a leading batch ---------------------------------

def _gradcheck(f, *shapes):
    torch.manual_seed(0)
    xs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-5)
    return xs


GRAD_CASES = {
    "conv": (lambda x, w: fn("Conv")(x, w, pads=[1, 0, 0, 1], strides=[2, 1], dilations=[1, 2]), (1, 2, 5, 5), (3, 2, 2, 2)),
    "conv_transpose": (lambda x, w: fn("ConvTranspose")(x, w, strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0]),
                       (1, 2, 3, 3), (2, 1, 3, 2)),
    "max_pool": (lambda x: fn("MaxPool")(x, kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1), (1, 2, 5, 6)),
    "average_pool": (lambda x: fn("AveragePool")(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 1, 5, 6)),
    "lp_pool": (lambda x: fn("LpPool")(x, kernel_shape=[2, 2], p=3), (1, 1, 4, 4)),
    "resize_cubic": (lambda x: fn("Resize")(x, None, torch.tensor([1.0, 1, 1.5, 0.7]), mode="cubic", antialias=1),
                     (1, 1, 4, 5)),
    "layer_norm": (lambda x, s, b: fn("LayerNormalization")(x, s, b, axis=1, n_outputs=3), (2, 3, 4), (3, 4), (4,)),
    "batch_norm_train": (lambda x, s, b: fn("BatchNormalization")(x, s, b, torch.zeros(3, dtype=torch.float64),
                                                                  torch.ones(3, dtype=torch.float64),
                                                                  training_mode=1, n_outputs=3),
                         (4, 3, 2), (3,), (3,)),
    "group_norm": (lambda x, s, b: fn("GroupNormalization")(x, s, b, num_groups=2), (2, 4, 3), (4,), (4,)),
    "lrn": (lambda x: fn("LRN")(x, size=3), (1, 4, 2, 2)),
    "lstm": (lambda x, w, r, p: fn("LSTM")(x, w, r, None, torch.tensor([3, 2]), None, None, p, n_outputs=3),
             (3, 2, 2), (1, 12, 2), (1, 12, 3), (1, 9)),
    "gru": (lambda x, w, r: fn("GRU")(x, w, r, direction="reverse", n_outputs=2), (3, 2, 2), (1, 9, 2), (1, 9, 3)),
    "gemm": (lambda a, b, c: fn("Gemm")(a, b, c, transA=1, alpha=0.3, beta=1.5), (3, 2), (3, 4), (4,)),
    "einsum": (lambda a, b: fn("Einsum")(a, b, equation="bij,bkj->bik"), (2, 3, 2), (2, 4, 2)),
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradcheck(name):
    f, *shapes = GRAD_CASES[name]
    _gradcheck(f, *shapes)


@pytest.mark.parametrize("name", ["conv", "conv_transpose", "max_pool", "average_pool", "resize_cubic",
                                  "layer_norm", "group_norm", "lstm", "gru", "einsum"])
def test_vmap_matches_a_loop(name):
    f, *shapes = GRAD_CASES[name]
    torch.manual_seed(0)
    first = lambda out: out[0] if isinstance(out, tuple) else out
    xs = [torch.randn(3, *s, dtype=torch.float64) for s in shapes]
    batched = torch.func.vmap(lambda *a: first(f(*a)))(*xs)
    looped = torch.stack([first(f(*[x[k] for x in xs])) for k in range(3)])
    torch.testing.assert_close(batched, looped)
