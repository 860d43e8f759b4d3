"""Second round of ops (losses, sampling, attention, signal, quantization, detection, random,
optional, training, strings): ONNX's node cases, float64 gradcheck of every differentiable op, vmap, the
losses against torch written directly (hypothesis), exported torch modules, and error paths."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import engine
from engine.conformance import PASS, UNSUPPORTED_TYPE, case_info, node_cases, run_case
from engine.errors import OnnxGradError, UnsupportedOpError
from engine.ops import activation, attention, detection, loss, nn, pool, quantize, sampling, signal, training

TRAINING = "ai.onnx.preview.training::"
MINE = frozenset("""
SoftmaxCrossEntropyLoss NegativeLogLikelihoodLoss GridSample AffineGrid Col2Im DeformConv Attention RMSNormalization
RotaryEmbedding TensorScatter SwiGLU LinearAttention CausalConvWithState ai.onnx.preview::FlexAttention DFT STFT
HannWindow HammingWindow BlackmanWindow MelWeightMatrix Det QuantizeLinear DequantizeLinear DynamicQuantizeLinear
QLinearMatMul QLinearConv ConvInteger BitCast RoiAlign NonMaxSuppression MaxUnpool Bernoulli Optional
OptionalHasElement OptionalGetElement TfIdfVectorizer
""".split()) | {TRAINING + op for op in ("Momentum", "Adagrad", "Adam")}
CASES = [c for c in node_cases() if case_info(c).op in MINE]
# numpy's complex64 FFT leaves ~2e-7 of rounding noise in components that are exactly 0, above
# these cases' atol of 1e-7; the engine's float64 transform returns the exact 0.
FFT_NOISE = {"test_dft_inverse", "test_dft_inverse_opset19"}


def test_every_op_has_cases():
    assert {case_info(c).op for c in CASES} == MINE - {"Optional"}  # Optional is tested inside If cases
    assert len(CASES) > 550


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_case(case):
    outcome = run_case(case)
    if outcome.status == UNSUPPORTED_TYPE:
        pytest.skip(f"torch has no such element type: {outcome.message}")
    if case.name in FFT_NOISE:
        inputs, (want,) = case.data_sets[0]
        x = inputs[0]
        got = engine.load(case.model).run(dict(zip([i.name for i in case.model.graph.input], inputs)))["y"]
        exact = np.fft.ifft(x[..., 0].astype(np.float64) + 1j * x[..., 1], axis=1)
        np.testing.assert_allclose(got, np.stack([exact.real, exact.imag], -1), atol=1e-6)
        np.testing.assert_allclose(got, want, atol=5e-6)
        return
    assert outcome.status == PASS, outcome.message


STRING_OPS = ("StringConcat", "RegexFullMatch", "StringSplit")
STRING_CASES = [c for c in node_cases() if case_info(c).op in STRING_OPS]


@pytest.mark.parametrize("case", STRING_CASES, ids=[c.name for c in STRING_CASES])
def test_string_node_case_through_model_run(case):
    """ONNX's backend interface (and so run_case) refuses string inputs; Model.run passes them through."""
    model = engine.load(case.model)
    names = [i.name for i in case.model.graph.input]
    for inputs, expected in case.data_sets:
        got = model.run(dict(zip(names, inputs)))
        for out, want in zip(case.model.graph.output, expected):
            assert got[out.name].shape == want.shape and got[out.name].dtype == want.dtype
            assert (got[out.name] == want).all(), out.name


# --- float64 gradcheck of every differentiable op ---------------------------------------------------
G = torch.Generator().manual_seed(0)


def rn(*shape, scale=1.0):
    return (torch.randn(shape, generator=G, dtype=torch.float64) * scale).requires_grad_()


def ri(high, *shape):
    return torch.randint(0, high, shape, generator=G)


def iv(*values):
    return torch.tensor(values, dtype=torch.int64)


def _loss(f, **kw):
    return lambda x, t, w=None: f(x, t, w, **kw)


_theta2 = torch.tensor([[[0.9, -0.3, 0.1], [0.2, 1.1, -0.2]]], dtype=torch.float64)
_offset = torch.rand((1, 2 * 4, 3, 3), generator=G, dtype=torch.float64) * 2 - 1
GRADCHECK = [
    # (name, function, inputs: tensors requiring grad are checked, others held fixed)
    ("sce_mean", _loss(loss.softmax_cross_entropy_loss), (rn(5, 4), ri(4, 5))),
    ("sce_weighted_ignore_nd", _loss(loss.softmax_cross_entropy_loss, ignore_index=1),
     (rn(3, 4, 2, 2), ri(4, 3, 2, 2), rn(4).abs().detach().add(0.5).requires_grad_())),
    ("sce_none_log_prob", lambda x, t: loss.softmax_cross_entropy_loss(x, t, reduction="none", n_outputs=2),
     (rn(3, 5, 2), ri(5, 3, 2))),
    ("nll_sum_weighted", _loss(loss.negative_log_likelihood_loss, reduction="sum"), (rn(4, 3), ri(3, 4), rn(3))),
    ("nll_mean_ignore", _loss(loss.negative_log_likelihood_loss, ignore_index=2), (rn(3, 3, 4), ri(3, 3, 4))),
    *[(f"grid_sample_{m}_{p}_{a}", (lambda m, p, a: lambda x, g: sampling.grid_sample(
        x, g, mode=m, padding_mode=p, align_corners=a))(m, p, a), (rn(1, 2, 4, 5), rn(1, 3, 2, 2, scale=0.7)))  # noqa: B023
      for m in ("linear", "cubic") for p in ("zeros", "border", "reflection") for a in (0, 1)],
    ("grid_sample_nearest_x", lambda x, g: sampling.grid_sample(x, g, mode="nearest"),
     (rn(1, 2, 4, 5), torch.rand((1, 3, 2, 2), generator=G, dtype=torch.float64) * 1.6 - 0.8)),
    ("grid_sample_3d", lambda x, g: sampling.grid_sample(x, g, padding_mode="border", align_corners=1),
     (rn(1, 2, 3, 4, 3), rn(1, 2, 2, 2, 3, scale=0.6))),
    ("grid_sample_1d", lambda x, g: sampling.grid_sample(x, g, mode="cubic"), (rn(2, 2, 5), rn(2, 4, 1, scale=0.6))),
    ("grid_sample_16_bicubic", lambda x, g: sampling.grid_sample_16(x, g, mode="bicubic"),
     (rn(1, 1, 3, 4), rn(1, 2, 3, 2, scale=0.7))),
    ("affine_grid_2d", lambda t: sampling.affine_grid(t, iv(2, 3, 4, 5)), (rn(2, 2, 3),)),
    ("affine_grid_3d_corners", lambda t: sampling.affine_grid(t, iv(1, 1, 2, 3, 4), align_corners=1), (rn(1, 3, 4),)),
    ("col2im_2d", lambda x: sampling.col2im(x, iv(5, 5), iv(2, 3), dilations=[2, 1], pads=[1, 0, 1, 1],
                                            strides=[2, 1]), (rn(1, 12, 3 * 4),)),
    ("col2im_3d", lambda x: sampling.col2im(x, iv(3, 3, 3), iv(2, 2, 2)), (rn(2, 8, 8),)),
    ("deform_conv", lambda x, w, o, b, m: sampling.deform_conv(x, w, o, b, m, pads=[1, 1, 0, 0]),
     (rn(1, 2, 4, 4), rn(3, 2, 2, 2), (_offset * 1.0).requires_grad_(), rn(3),
      torch.rand((1, 4, 3, 3), generator=G, dtype=torch.float64).requires_grad_())),
    ("attention_4d_mask", lambda q, k, v, m: attention.attention(q, k, v, m), (rn(1, 2, 3, 4), rn(1, 2, 5, 4),
                                                                               rn(1, 2, 5, 3), rn(3, 5))),
    ("attention_3d_gqa_causal_softcap", lambda q, k, v: attention.attention(
        q, k, v, is_causal=1, q_num_heads=4, kv_num_heads=2, softcap=2.0), (rn(2, 3, 8), rn(2, 3, 4), rn(2, 3, 6))),
    ("attention_past_window", lambda q, k, v, pk, pv: attention.attention(
        q, k, v, None, pk, pv, is_causal=1, left_window_size=2, n_outputs=4),
     (rn(1, 1, 2, 3), rn(1, 1, 2, 3), rn(1, 1, 2, 3), rn(1, 1, 3, 3), rn(1, 1, 3, 3))),
    # A fully masked query row gives zeros and zero gradient, never NaN.
    ("attention_fully_masked_row", lambda q, k, v: attention.attention(
        q, k, v, torch.tensor([[True, True], [False, False]])), (rn(1, 1, 2, 3), rn(1, 1, 2, 3), rn(1, 1, 2, 3))),
    ("rms_norm", lambda x, s: nn.rms_norm(x, s, axis=1), (rn(2, 3, 4), rn(3, 4))),
    ("rotary_interleaved_partial", lambda x, c, s: attention.rotary_embedding(
        x, c, s, iv(0, 2, 1), interleaved=1, num_heads=2, rotary_embedding_dim=4), (rn(1, 3, 12), rn(3, 2), rn(3, 2))),
    ("rotary_4d", lambda x, c, s: attention.rotary_embedding(x, c, s), (rn(1, 2, 3, 4), rn(1, 3, 2), rn(1, 3, 2))),
    ("tensor_scatter_circular", lambda p, u: attention.tensor_scatter(p, u, iv(3, 1), mode="circular"),
     (rn(2, 2, 4, 3), rn(2, 2, 2, 3))),
    ("swiglu", lambda a, b: activation.swiglu(a, b, alpha=1.5), (rn(3, 4), rn(3, 4))),
    ("linear_attention_gated_delta", lambda q, k, v, p, d, b: attention.linear_attention(
        q, k, v, p, d, b, q_num_heads=2, kv_num_heads=1, n_outputs=2),
     (rn(1, 3, 4), rn(1, 3, 2, scale=0.5), rn(1, 3, 3), rn(1, 1, 2, 3), rn(1, 3, 1, scale=0.3),
      torch.rand((1, 3, 1), generator=G, dtype=torch.float64).requires_grad_())),
    ("causal_conv_silu_state", lambda x, w, b, s: attention.causal_conv_with_state(
        x, w, b, s, activation="silu", n_outputs=2), (rn(2, 3, 4), rn(3, 1, 3), rn(3), rn(2, 3, 2))),
    ("roi_align_avg", lambda x, r: detection.roi_align(x, r, iv(0, 1), output_height=2, output_width=3,
                                                       sampling_ratio=2),
     (rn(2, 2, 6, 7), torch.tensor([[0.3, 0.75, 4.6, 3.95], [1.2, 0.1, 5.3, 5.4]], dtype=torch.float64,
                                   requires_grad=True))),
    ("roi_align_max_adaptive", lambda x: detection.roi_align(x, torch.tensor([[0.3, 0.7, 4.6, 3.9]]).double(),
                                                             iv(0), mode="max", output_height=2), (rn(1, 2, 6, 7),)),
    ("max_unpool", lambda x: pool.max_unpool(x, iv(1, 6, 8, 15).reshape(1, 1, 2, 2), iv(1, 1, 5, 5),
                                             kernel_shape=[2, 2], strides=[2, 2]), (rn(1, 1, 2, 2),)),
    ("dft_complex", lambda x: signal.dft(x, None, iv(1)), (rn(2, 5, 3, 2),)),
    ("dft_rfft_padded", lambda x: signal.dft(x, iv(8), iv(1), onesided=1), (rn(2, 5, 1),)),
    ("dft_irfft", lambda x: signal.dft_17(x, axis=1, inverse=1, onesided=1), (rn(1, 4, 2),)),
    ("stft_window", lambda x, w: signal.stft(x, iv(2), w), (rn(1, 9, 1), rn(4))),
    ("det", nn.det, (rn(2, 3, 3),)),
    ("dequantize_blocked", lambda s: quantize.dequantize_linear(
        torch.arange(-6, 6, dtype=torch.int8).reshape(3, 4), s, torch.tensor([[1, -2], [0, 3], [2, 2]],
                                                                                dtype=torch.int8),
        axis=1, block_size=2), (rn(3, 2),)),
    ("momentum_nesterov", lambda r, x, g, v: training.momentum(r, iv(3), x, g, v, alpha=0.9, beta=0.5,
                                                               mode="nesterov", norm_coefficient=0.01),
     (rn(), rn(3), rn(3), rn(3))),
    ("adagrad", lambda x, g, h: training.adagrad(torch.tensor(0.1, dtype=torch.float64), iv(2), x, g, h,
                                                 decay_factor=0.1),
     (rn(3), rn(3), rn(3).abs().detach().requires_grad_())),
    ("adam", lambda x, g, v, h: training.adam(torch.tensor(0.1, dtype=torch.float64), iv(2), x, g, v, h,
                                              norm_coefficient=0.01, norm_coefficient_post=0.02),
     (rn(3), rn(3), rn(3), rn(3).abs().detach().requires_grad_())),
]


@pytest.mark.parametrize("name, fn, inputs", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_float64(name, fn, inputs):
    assert any(t.requires_grad for t in inputs)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


VMAPPED = {"sce_weighted_ignore_nd", "nll_sum_weighted", "grid_sample_cubic_reflection_1", "grid_sample_3d",
           "affine_grid_2d", "col2im_2d", "deform_conv", "attention_4d_mask", "attention_fully_masked_row",
           "rms_norm", "rotary_interleaved_partial", "tensor_scatter_circular", "linear_attention_gated_delta",
           "causal_conv_silu_state", "max_unpool", "dft_complex", "stft_window", "roi_align_max_adaptive"}


@pytest.mark.parametrize("name, fn, inputs", [g for g in GRADCHECK if g[0] in VMAPPED],
                         ids=[g[0] for g in GRADCHECK if g[0] in VMAPPED])
def test_vmap_over_first_input_matches_a_loop(name, fn, inputs):
    """The verifier batches finite-difference perturbations with torch.func.vmap."""
    first = inputs[0].detach()
    batch = torch.stack([first, first * 0.5 + 0.1, -first])
    rest = [t.detach() for t in inputs[1:]]

    def one(x):
        out = fn(x, *rest)
        return out if isinstance(out, torch.Tensor) else torch.cat([o.reshape(-1) for o in out])

    got = torch.func.vmap(one)(batch)
    want = torch.stack([one(b) for b in batch])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# --- losses against torch written directly ----------------------------------------------------------
def _loss_model(op, n_dims, reduction, ignore_index, weighted, log_prob):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * n_dims),
              helper.make_tensor_value_info("t", TensorProto.INT64, [None] * (n_dims - 1))]
    if weighted:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [None]))
    outputs = ["y", "log_prob"] if log_prob else ["y"]
    attrs = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    node = helper.make_node(op, [i.name for i in inputs], outputs, **attrs)
    shapes = {"y": [None] * (n_dims - 1) if reduction == "none" else [], "log_prob": [None] * n_dims}
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o])
                                                   for o in outputs])
    return engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), op=st.sampled_from(["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"]),
       reduction=st.sampled_from(["none", "sum", "mean"]), weighted=st.booleans(),
       ignore=st.sampled_from([None, 0, 2, -1]))
def test_losses_match_torch(data, op, reduction, weighted, ignore):
    n, c = data.draw(st.integers(1, 4), "N"), data.draw(st.integers(2, 5), "C")
    extra = data.draw(st.lists(st.integers(1, 3), max_size=2), "extra dims")
    seed = data.draw(st.integers(0, 2**16), "seed")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, c, *extra), generator=gen)
    t = torch.randint(0, c, (n, *extra), generator=gen)
    if ignore is not None:
        t = torch.where(torch.rand(t.shape, generator=gen) < 0.3, torch.full_like(t, ignore), t)
        t.view(-1)[0] = 1  # at least one target counts, so the mean is defined
    w = torch.rand(c, generator=gen) + 0.25 if weighted else None
    softmax = op == "SoftmaxCrossEntropyLoss"
    model = _loss_model(op, x.dim(), reduction, ignore, weighted, log_prob=softmax)
    feeds = {"x": x.numpy(), "t": t.numpy()} | ({"w": w.numpy()} if weighted else {})
    kwargs = {"reduction": reduction, "ignore_index": -100 if ignore is None else ignore}

    def torch_loss(x, w):
        return (F.cross_entropy if softmax else F.nll_loss)(x, t, weight=w, **kwargs)

    def direct_loss(x, w):
        """The same loss by one-hot masks instead of a gather: torch has no gradient for `weight`."""
        logp = torch.log_softmax(x, 1) if softmax else x
        kept = t != kwargs["ignore_index"]
        onehot = F.one_hot(torch.where(kept, t, 0), c).movedim(-1, 1).to(x.dtype)
        per = -(logp * onehot).sum(1)
        wt = (onehot * (w if w is not None else torch.ones(c, dtype=x.dtype)).reshape(1, c, *[1] * len(extra))).sum(1)
        wt = wt * kept
        return {"none": per * wt, "sum": (per * wt).sum(), "mean": (per * wt).sum() / wt.sum()}[reduction]

    got = model.run(feeds)
    np.testing.assert_allclose(got["y"], torch_loss(x, w).numpy(), rtol=1e-5, atol=1e-6)
    if softmax:
        np.testing.assert_allclose(got["log_prob"], torch.log_softmax(x, 1).numpy(), rtol=1e-5, atol=1e-6)

    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_() if weighted else None
    y = torch_loss(xd, None if wd is None else wd.detach())
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    want = {"x": torch.autograd.grad(y, xd, dy)[0]}
    if weighted:
        y_direct = direct_loss(xd, wd)
        torch.testing.assert_close(y_direct, y, rtol=1e-12, atol=1e-12)
        want["w"] = torch.autograd.grad(y_direct, wd, dy)[0]
    result = model.gradient("y", xs=list(want), zs=["t"], feeds=feeds, dy=dy.numpy(), dtype="float64")
    np.testing.assert_allclose(result.y, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, g in want.items():
        np.testing.assert_allclose(result.grads[name], g.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


# --- torch modules exported to ONNX -----------------------------------------------------------------
EXPORTED = [
    ("cross_entropy_nd_weighted_ignore", lambda x, t: F.cross_entropy(
        x, t, weight=torch.tensor([0.5, 2.0, 1.0], dtype=x.dtype), ignore_index=1, reduction="sum"),
     [(2, 3, 4), ("int", 3, (2, 4))], "SoftmaxCrossEntropyLoss", 16),
    ("nll_loss_none", lambda x, t: F.nll_loss(x, t, reduction="none"), [(5, 4), ("int", 4, (5,))],
     "NegativeLogLikelihoodLoss", 16),
    ("grid_sample_bicubic_reflection", lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode="reflection",
                                                                  align_corners=True),
     [(1, 2, 4, 5), (1, 3, 3, 2)], "GridSample", 16),
    ("grid_sample_nearest_border", lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border",
                                                              align_corners=False),
     [(1, 2, 4, 5), (1, 3, 3, 2)], "GridSample", 16),
    ("affine_grid_then_sample", lambda x, t: F.grid_sample(x, F.affine_grid(t, [1, 2, 3, 4], align_corners=False),
                                                           align_corners=False),
     [(1, 2, 4, 5), (1, 2, 3)], "AffineGrid", 20),
]


@pytest.mark.parametrize("name, f, shapes, op, opset", EXPORTED, ids=[e[0] for e in EXPORTED])
def test_exported_module_matches_torch(name, f, shapes, op, opset):
    from tests.run.test_torch_export import export, feeds_of, make_inputs
    from tests.torch_export_models import Fn

    gen = torch.Generator().manual_seed(1)
    inputs = make_inputs(shapes, gen)
    model = engine.load(export(Fn(f), inputs, opset))
    assert op in {n.op_type for n in model.graph.nodes}
    np.testing.assert_allclose(model.run(feeds_of(inputs))["y"], f(*inputs).numpy(), rtol=1e-5, atol=1e-5)
    leaves = [t.double().requires_grad_() if t.is_floating_point() else t for t in inputs]
    y = f(*leaves)
    floats = [k for k, t in enumerate(leaves) if t.is_floating_point()]
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(y, [leaves[k] for k in floats], dy, allow_unused=True)
    result = model.gradient("y", xs=[f"x{k}" for k in floats], zs=[f"x{k}" for k in range(len(leaves))
                                                                     if k not in floats],
                            feeds=feeds_of(leaves), dy=dy.numpy(), dtype="float64")
    for k, g in zip(floats, want):
        g = np.zeros(leaves[k].shape) if g is None else g.numpy()
        np.testing.assert_allclose(result.grads[f"x{k}"], g, rtol=1e-9, atol=1e-9, err_msg=f"x{k}")


# --- ops without node cases: onnxruntime and the reference evaluator ---------------------------------
def _single(op, inputs, out_type, out_shape, opset=22, **attrs):
    elem = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64}
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, elem[v.dtype], v.shape)
                                           for n, v in zip(names, inputs)],
                              [helper.make_tensor_value_info("y", out_type, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, dict(zip(names, inputs))


def test_max_roi_pool_matches_onnxruntime():
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 9)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 5], [1, 0.4, 2.6, 8.2, 7.9], [0, 3, 3, 3, 3]], dtype=np.float32)
    model, feeds = _single("MaxRoiPool", [x, rois], TensorProto.FLOAT, [3, 3, 2, 3], opset=13, pooled_shape=[2, 3],
                           spatial_scale=0.9)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(engine.load(model).run(feeds)["y"], want, rtol=1e-6)


@pytest.mark.parametrize("op, attrs", [
    ("RandomUniform", {"shape": [3, 4], "low": -2.0, "high": 3.0, "seed": 5.0}),
    ("RandomNormal", {"shape": [2, 5], "mean": 1.0, "scale": 0.5, "seed": 7.0, "dtype": TensorProto.DOUBLE}),
])
def test_seeded_generators_match_the_reference(op, attrs):
    model, _ = _single(op, [], attrs.get("dtype", TensorProto.FLOAT), attrs["shape"], opset=13, **attrs)
    want = ReferenceEvaluator(model).run(None, {})[0]
    got = engine.load(model).run({})["y"]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op", ["Bernoulli", "RandomUniformLike", "RandomNormalLike"])
def test_seeded_like_generators_match_the_reference(op):
    x = np.random.default_rng(0).uniform(size=(40, 5)).astype(np.float32)
    model, feeds = _single(op, [x], TensorProto.FLOAT, x.shape, seed=3.0)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(engine.load(model).run(feeds)["y"], want, rtol=1e-6)


def test_multinomial_samples_follow_the_distribution():
    logits = np.log(np.array([[0.1, 0.6, 0.3], [1e-9, 1e-9, 1.0]], dtype=np.float32))
    model, feeds = _single("Multinomial", [logits], TensorProto.INT32, [2, 4000], sample_size=4000, seed=2.0)
    y = engine.load(model).run(feeds)["y"]
    assert y.shape == (2, 4000) and y.dtype == np.int32
    assert (y[1] == 2).all()
    np.testing.assert_allclose(np.bincount(y[0], minlength=3) / 4000, [0.1, 0.6, 0.3], atol=0.03)


# --- unsupported attribute values are one-line errors, never wrong numbers ----------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: loss.softmax_cross_entropy_loss(torch.zeros(2, 3), iv(0, 1), reduction="max"), "reduction"),
    (lambda: sampling.grid_sample(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 1, 2), mode="bilinear"), "mode"),
    (lambda: sampling.grid_sample(torch.zeros(1, 1, 2, 2, 2), torch.zeros(1, 1, 1, 1, 3), mode="cubic"), "3-D"),
    (lambda: sampling.grid_sample(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 1, 2), padding_mode="wrap"),
     "padding_mode"),
    (lambda: detection.roi_align(torch.zeros(1, 1, 2, 2), torch.zeros(1, 4), iv(0), mode="min"), "mode"),
    (lambda: quantize.quantize_linear(torch.zeros(2), torch.ones(()), output_dtype=TensorProto.INT4), "INT4"),
    (lambda: attention.tensor_scatter(torch.zeros(1, 2, 2), torch.zeros(1, 1, 2), mode="ring"), "mode"),
])
def test_unsupported_values_raise(call, match):
    with pytest.raises(UnsupportedOpError, match=match):
        call()


def test_bad_shapes_raise_one_line_errors():
    with pytest.raises(OnnxGradError, match="does not fit"):
        sampling.col2im(torch.zeros(1, 4, 5), iv(3, 3), iv(2, 2))
    with pytest.raises(OnnxGradError, match="target"):
        loss.negative_log_likelihood_loss(torch.zeros(2, 3), iv(0, 1, 2).reshape(1, 3))
    with pytest.raises(OnnxGradError, match="multiple"):
        attention.attention(torch.zeros(1, 3, 2, 4), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
