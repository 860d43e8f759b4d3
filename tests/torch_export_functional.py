"""Functional cases for tests/run/test_torch_export.py: reductions, losses, indexing and shape ops,
ops the exporter writes as several nodes, what the exporter (or our engine) cannot handle yet, and
the elementwise family that the hypothesis test drives. Cases are ExportCases (tests/torch_export_models.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.torch_export_models import case, fn

# --- reductions, scans, softmax, losses -----------------------------------------------------------
R = (2, 3, 4)
REDUCE_CASES = [
    fn("sum_dim", lambda x: x.sum(1), R, ops="ReduceSum", opsets=(9, 11, 13)),
    fn("sum_keepdim", lambda x: x.sum((0, 2), keepdim=True), R, ops="ReduceSum", opsets=(11, 13)),
    fn("mean_dims", lambda x: x.mean((0, 2)), R, ops="ReduceMean", opsets=(11, 18)),
    fn("amax", lambda x: x.amax(-1), R, ops="ReduceMax", opsets=(11, 18)),
    fn("amin_keepdim", lambda x: x.amin((0, 1), keepdim=True), R, ops="ReduceMin", opsets=(11, 18)),
    fn("max_dim_values", lambda x: x.max(1)[0] + x.min(2, keepdim=True)[0].sum(), R, ops="ReduceMax ReduceMin"),
    fn("prod_dim", lambda x: x.prod(1), R, ops="ReduceProd", opsets=(11, 18)),
    fn("logsumexp", lambda x: x.logsumexp(2), R, ops="ReduceLogSumExp", opsets=(11, 18)),
    fn("norm_l2", lambda x: x.norm(dim=1), R, ops="ReduceL2", opsets=(11, 18)),
    fn("norm_l1_keepdim", lambda x: torch.linalg.vector_norm(x, 1, dim=(1, 2), keepdim=True), R, ops="ReduceL1",
       opsets=(11, 18)),
    fn("var_std", lambda x: x.var(1) + x.std(2, unbiased=False).sum(), R, opsets=(13,)),
    fn("sum_all_mean_all", lambda x: x.sum() * x.mean(), R),
    fn("cumsum", lambda x: x.cumsum(1) + x.cumsum(-1).flip(0), R, ops="CumSum", opsets=(11, 14)),
    fn("topk_values", lambda x: x.topk(2, dim=-1)[0] * 2 + x.topk(1, 1, largest=False)[0].sum(), R, ops="TopK",
       opsets=(11, 13)),
    fn("sort_values", lambda x: x.sort(1, descending=True)[0], R, ops="TopK"),
    fn("softmax_dim1", lambda x: x.softmax(1), R, ops="Softmax", opsets=(9, 11, 13)),
    fn("log_softmax_dim0", lambda x: x.log_softmax(0), R, ops="LogSoftmax", opsets=(9, 11, 13)),
    fn("normalize_cosine", lambda x, y: F.normalize(x, dim=1) + F.cosine_similarity(x, y, dim=-1)[..., None], R, R),
    fn("mse_loss", lambda x, y: F.mse_loss(x, y) + F.mse_loss(x, y, reduction="sum"), R, R),
    *(fn(name, f, R, R, opsets=(13, 18), export_limit=f"torch {torch.__version__}'s TorchScript exporter has no "
         f"symbolic for aten::{name} at any opset")
      for name, f in [("l1_loss", F.l1_loss), ("smooth_l1_loss", F.smooth_l1_loss), ("huber_loss", F.huber_loss)]),
    fn("bce_with_logits", lambda x, y: F.binary_cross_entropy_with_logits(x, torch.sigmoid(y)), R, R),
    fn("cross_entropy", lambda x, t: F.cross_entropy(x, t), (4, 3), ("int", 3, (4,)), ops="SoftmaxCrossEntropyLoss"),
    fn("nll_loss", lambda x, t: F.nll_loss(x, t), (4, 3), ("int", 3, (4,)), ops="NegativeLogLikelihoodLoss"),
]


# --- indexing and shape manipulation --------------------------------------------------------------
def _const(*rows):
    return torch.tensor(rows)


INDEXING_CASES = [
    fn("slice_steps_negative", lambda x: x[:, 1::2, -3:-1] * 2 + x[-1:, ::3, 1:3], (3, 5, 6), ops="Slice",
       opsets=(10, 11, 13)),
    fn("select_negative", lambda x: x[:, -1] + x[0, 2:3, :] + x[..., -2], (3, 4, 4), ops="Gather"),
    fn("flip", lambda x: x.flip(1) * x, (2, 3, 4), opsets=(11, 13)),
    fn("index_select", lambda x: x.index_select(1, torch.tensor([2, 0, 2])), (2, 3, 4), ops="Gather"),
    fn("index_tensor_input", lambda x, i: x[i] * 2, (5, 3), ("int", 5, (2, 4)), ops="Gather"),
    fn("advanced_index_pairs", lambda x: x[[0, 1, 1], [2, 0, 2]], (3, 4)),
    fn("gather", lambda x, i: torch.gather(x, 1, i), (3, 4), ("int", 4, (3, 5)), ops="GatherElements",
       opsets=(11, 13)),
    # Below opset 16 the exporter writes scatter_add as ScatterElements (no reduction) + Add, which
    # is wrong for repeated indices (onnxruntime agrees with us there): repeated indices at 16+ only.
    fn("scatter_add_repeated", lambda x, s: x.scatter_add(1, _const([0, 1, 0], [2, 2, 1]), s), (2, 4), (2, 3),
       ops="ScatterElements", opsets=(16, 18)),
    fn("scatter_add_unique", lambda x, s: x.scatter_add(1, _const([0, 3, 1], [2, 0, 1]), s), (2, 4), (2, 3),
       ops="ScatterElements", opsets=(11,)),
    fn("scatter", lambda x, s: x.scatter(1, _const([0, 3], [2, 1]), s[:, :2]), (2, 4), (2, 3),
       ops="ScatterElements", opsets=(11, 13)),
    fn("index_put", lambda x, v: x.clone().index_put_((torch.tensor([1, 3]),), v), (4, 3), (2, 3)),
    fn("masked_fill", lambda x, m: x.masked_fill(m > 0, -2.0) * x, (3, 4), (3, 4), ops="Where"),
    fn("where_tensor", lambda x, y: torch.where(x > y, x * y, y - x), (3, 4), (4,), ops="Where"),
    fn("flatten_unflatten", lambda x: x.flatten(1).unflatten(1, (4, 3)) * x.flatten().sum(), (2, 3, 4),
       ops="Reshape"),
    fn("nn_flatten", lambda x: nn.Flatten()(x), (2, 3, 2, 2), ops="Flatten"),
    fn("permute_transpose", lambda x: x.permute(2, 0, 1) + x.transpose(0, 2).transpose(1, 2), (2, 3, 3),
       ops="Transpose"),
    fn("cat_stack", lambda x, y: torch.cat([torch.stack([x, y * 2], 0), (x * y)[None]], 0), (2, 3), (2, 3),
       ops="Concat"),
    fn("chunk", lambda x: sum(c * (i + 1) for i, c in enumerate(x.chunk(3, dim=1))), (2, 6, 2), ops="Slice",
       opsets=(11, 13, 18)),
    fn("split_sizes", lambda x: torch.cat(x.split([1, 3], dim=1)[::-1], dim=1), (2, 4, 3), ops="Split",
       opsets=(11, 13, 18)),
    fn("unbind", lambda x: x.unbind(1)[0] * x.unbind(1)[2], (2, 3, 4)),
    fn("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0).unsqueeze(-1), (2, 1, 3), ops="Squeeze Unsqueeze",
       opsets=(9, 11, 13)),
    fn("repeat_expand", lambda x, y: x.repeat(2, 1, 3) + y.expand(4, 3, 6), (2, 3, 2), (1, 3, 1),
       ops="Tile Expand", opsets=(11, 13)),
    fn("narrow_roll", lambda x: x.narrow(1, 1, 2) + x.roll(1, 1)[:, :2], (2, 4)),
    fn("tril_triu", lambda x: x.tril() + 2 * x.triu(1), (4, 4), opsets=(14,), ops="Trilu"),
    fn("pad_constant", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), (2, 3, 4), ops="Pad", opsets=(9, 11, 13, 18)),
    fn("pad_reflect", lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), (1, 2, 4, 5), ops="Pad",
       opsets=(11, 13, 18)),
    fn("pad_replicate", lambda x: F.pad(x, (2, 1), mode="replicate"), (2, 3, 4), ops="Pad", opsets=(11, 18)),
    fn("pad_circular", lambda x: F.pad(x, (1, 2, 1, 0), mode="circular"), (1, 2, 3, 4)),
    fn("matmul_broadcast", lambda x, y: x @ y + torch.bmm(x, y.expand(2, 4, 3)), (2, 3, 4), (4, 3), ops="MatMul"),
    fn("linear_3d", lambda x, w: F.linear(x, w), (2, 3, 4), (5, 4), ops="MatMul"),
]


# --- more that the exporter writes as several ops, or as ops the families above do not reach --------
class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(3, 4, batch_first=True, bidirectional=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True)[0]


def _setitem(x, v):
    y = x.clone()
    y[:, 1:3] = v
    return y


def _limit(what):
    return f"torch {torch.__version__}'s TorchScript exporter cannot export {what}"


X4 = (1, 2, 4, 6)
MORE_CASES = [
    case("packed_lstm", PackedLSTM, (3, 5, 3), ("lengths", (5, 2, 4)), ops="LSTM",
         params=("rnn.weight_ih_l0", "rnn.weight_hh_l0_reverse", "rnn.bias_ih_l0")),
    fn("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), *[(2, 2, 4, 4)] * 3,
       ops="MatMul Softmax Trilu", opsets=(14,)),
    fn("sdpa_float_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
       *[(2, 2, 4, 4)] * 3, (4, 4), ops="MatMul Softmax", opsets=(14,)),
    case("conv2d_circular", lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"), (1, 2, 5, 5),
         ops="Conv", params=("weight",)),
    case("conv_transpose3d", lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), (1, 2, 2, 3, 2), ops="ConvTranspose",
         params=("weight", "bias")),
    fn("conv2d_weight_input", lambda x, w: F.conv2d(x, w, padding=1), X4, (3, 2, 3, 3), ops="Conv"),
    fn("interpolate_scale_1_5", lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest")
       + F.interpolate(x, scale_factor=1.5, mode="bilinear"), X4, ops="Resize", opsets=(11, 13)),
    fn("interpolate_down_align", lambda x: F.interpolate(x, size=(3, 4), mode="bilinear", align_corners=True)
       + F.interpolate(x, size=(3, 4), mode="nearest"), X4, ops="Resize"),
    # Scales that are not exact in float32 (5/3 is 1.6666666): lengths 3 -> 5 and 6 -> 7 as in torch.
    fn("interpolate_scale_5_3_nearest", lambda x: F.interpolate(x, scale_factor=(5 / 3, 7 / 6), mode="nearest"),
       (1, 2, 3, 6), opsets=(10, 13)),
    fn("interpolate_scale_5_3_bilinear", lambda x: F.interpolate(x, scale_factor=(5 / 3, 7 / 6), mode="bilinear"),
       (1, 2, 3, 6), ops="Resize", opsets=(11, 13), grad_rtol=1e-5),  # torch's float64 uses 5/3, the file 1.6666666
    # Before opset 11 the exporter writes Upsample (9) or Resize-10; only nearest keeps torch's
    # coordinates there (linear modes are asymmetric before 11, the exporter warns).
    fn("interpolate_nearest_legacy",
       lambda x: F.interpolate(x, size=(5, 7)) + F.interpolate(x, scale_factor=2)[..., :5, :7], (1, 2, 3, 4),
       opsets=(9, 10)),
    fn("interpolate_bicubic_align", lambda x: F.interpolate(x, size=(5, 7), mode="bicubic", align_corners=True), X4,
       ops="Resize"),
    fn("adaptive_pools_factor", lambda x: F.adaptive_avg_pool2d(x, (2, 3)) + F.adaptive_max_pool2d(x, (2, 3)), X4,
       ops="AveragePool MaxPool"),
    fn("avgpool_ceil_include_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True),
       (2, 2, 6, 7), ops="AveragePool", opsets=(11, 19)),
    fn("maxpool3d_ceil", lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), padding=1, ceil_mode=True), (1, 2, 3, 4, 5),
       ops="MaxPool"),
    fn("lp_pool2d", lambda x: F.lp_pool2d(x, 2, 2), (1, 2, 4, 4), ops="AveragePool"),
    fn("unfold_im2col", lambda x: F.unfold(x, 2), X4, ops="Gather Pad"),
    case("softmax2d", nn.Softmax2d, X4, ops="Softmax"),
    case("norms_without_affine", lambda: nn.Sequential(nn.InstanceNorm1d(3), nn.BatchNorm1d(3, affine=False)),
         (2, 3, 5), ops="InstanceNormalization BatchNormalization", opsets=(15,)),
    case("batchnorm_batch_stats", lambda: nn.BatchNorm1d(3, track_running_stats=False), (4, 3, 5),
         params=("weight", "bias"), opsets=(15,)),
    case("prelu_scalar_4d", lambda: nn.Sequential(nn.PReLU(), nn.PReLU(2)), X4, ops="PRelu",
         params=("0.weight", "1.weight"), opsets=(11, 16)),
    case("rrelu_eval", nn.RReLU, (3, 4), ops="LeakyRelu", grad_rtol=1e-6),  # slope (1/8 + 1/3) / 2 in float32
    fn("masked_select_nonzero", lambda x: x.masked_select(x > 0) * 2 + x[torch.where(x < 0)].sum(), X4,
       ops="NonZero GatherND"),
    fn("argmax_argsort_gather", lambda x: x.gather(1, x.argmax(1, keepdim=True)) * x.gather(1, x.argsort(1)),
       (3, 5), ops="ArgMax TopK GatherElements"),
    fn("one_hot", lambda i, x: F.one_hot(i, 4).float() * x, ("int", 4, (3,)), (3, 4), ops="OneHot"),
    fn("einsum_variants", lambda x, y: torch.einsum("bii->bi", x).sum(0) + torch.einsum("i,j->ij", y, y)[0, :3]
       + torch.einsum("bij->", x) + torch.einsum("ii", x[0]), (2, 3, 3), (4,), ops="Einsum"),
    fn("arange_float", lambda x: x * torch.arange(x.shape[1], dtype=x.dtype) + torch.arange(0.0, 1.0, 0.25),
       (3, 4), dynamic={"x0": {0: "a"}}, resized=((5, 4),)),
    fn("index_negative_input", lambda x, i: x[i], (5, 3), ("int", (-5, 5), (4,)), ops="Gather"),
    fn("index_put_accumulate_unique", lambda x, v: x.index_put((torch.tensor([3, 0, 1]),), v, accumulate=True),
       (4, 3), (3, 3), ops="ScatterND"),
    fn("setitem_slice", _setitem, (3, 4), (3, 2), ops="ScatterND"),
    fn("split_to_sequence", lambda x: torch.cat(x.tensor_split(3, 1)[::-1], 1), (2, 7), ops="SplitToSequence"),
    fn("meshgrid_cat", lambda x, y: sum(torch.meshgrid(x, y, indexing="ij")) + torch.cat([x, x.new_zeros(1)])[1:, None],
       (3,), (4,)),
    fn("clamp_tensor_bounds_lerp", lambda x, lo, hi: torch.lerp(torch.clamp(x, lo, hi), x, 0.25), (3, 4), (4,), (4,)),
    fn("var_std_all", lambda x: torch.var_mean(x, 1)[0].sum() + x.std(), (3, 4)),
    # The exporter takes the root as a power 1 / (p + 1e-6), so float64 values differ from torch by ~1e-6.
    fn("cdist_pairwise", lambda x, y: torch.cdist(x, y) + F.pairwise_distance(x, y[:3])[:, None], (3, 4), (5, 4),
       grad_rtol=1e-5),
    fn("baddbmm_addmm", lambda a, x, y: torch.baddbmm(a, x, y, beta=0.5, alpha=2.0)
       + torch.addmm(a[0], x[0], y[0], beta=0.5, alpha=2.0), (2, 3, 5), (2, 3, 4), (2, 4, 5), ops="Gemm MatMul"),
    fn("vector_norms", lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1) + torch.linalg.vector_norm(x, 3, 1)
       + torch.linalg.matrix_norm(x)[:, None], (2, 3, 4), opsets=(11, 18)),
    *(fn(f"unexportable_{name}", f, (3, 4), export_limit=_limit(f"aten::{name}"))
      for name, f in [("sinh", torch.sinh), ("cosh", torch.cosh), ("asinh", torch.asinh), ("expm1", torch.expm1),
                      ("trunc", torch.trunc), ("cumprod", lambda x: x.cumprod(1)), ("diff", lambda x: x.diff(dim=1)),
                      ("rms_norm", lambda x: F.rms_norm(x, (4,)))]),
    fn("interpolate_nearest_exact", lambda x: F.interpolate(x, size=(3, 5), mode="nearest-exact"), X4, opsets=(18,),
       export_limit=_limit("aten::_upsample_nearest_exact2d")),
    fn("interpolate_antialias", lambda x: F.interpolate(x, size=(2, 3), mode="bilinear", antialias=True), X4,
       opsets=(18,), export_limit=_limit("aten::_upsample_bilinear2d_aa")),
    fn("adaptive_avgpool_not_factor", lambda x: F.adaptive_avg_pool2d(x, (3, 4)), X4,
       export_limit=_limit("adaptive_avg_pool2d to a size that does not divide the input")),
    case("threshold", lambda: nn.Threshold(0.1, 20.0), (3, 4),
         export_limit=_limit("threshold with a non-zero threshold")),
    case("bilinear_layer", lambda: nn.Bilinear(4, 5, 2), (3, 4), (3, 5), export_limit=_limit("aten::bilinear")),
    case("celu_opset11", nn.CELU, (3, 4), opsets=(11,), export_limit=_limit("aten::celu below opset 12")),
    # Control flow: the exporter writes these with If / Loop subgraphs.
    case("local_response_norm", lambda: nn.LocalResponseNorm(3), (2, 4, 3, 3), ops="If", opsets=(17,)),
    fn("hstack", lambda x, y: torch.hstack([x, y]), (2, 3), (2, 2), ops="If"),
    case("embedding_bag", lambda: nn.EmbeddingBag(5, 3, mode="mean"), ("int", 5, (2, 3)), ops="Loop",
         params=("weight",)),
    fn("grid_sample", lambda x, g: F.grid_sample(x, g.tanh(), align_corners=False), X4, (1, 3, 3, 2),
       ops="GridSample", opsets=(16,)),
    fn("fold_col2im", lambda x: F.fold(x, (3, 4), 2), (1, 8, 6), ops="Col2Im", opsets=(18,)),
]

FUNCTIONAL_CASES = REDUCE_CASES + INDEXING_CASES + MORE_CASES


# --- elementwise math, driven by hypothesis: input 0 is (a, b), input 1 broadcasts as (b,) --------
@dataclass(frozen=True)
class Elementwise:
    name: str
    f: Callable
    domains: tuple[str, ...]  # per input: "real" [-3, 3], "pos" [0.25, 3], "unit" [-0.875, 0.875],
                              # "prob" [0.125, 0.875]
    kinks: tuple[float, ...] = ()  # values of input 0 where f is not differentiable: kept away from
    ties: bool = False  # f is not differentiable where input 0 equals input 1: kept apart
    op: str = ""


INTEGERS = tuple(float(k) for k in range(-4, 5))
MULTIPLES = tuple(1.5 * k for k in range(-2, 3))
# Not here: sinh, cosh, asinh, expm1 and trunc, which the exporter refuses (the unexportable_* cases).
ELEMENTWISE = [
    Elementwise("exp", torch.exp, ("real",), op="Exp"),
    Elementwise("log", torch.log, ("pos",), op="Log"),
    Elementwise("log1p", torch.log1p, ("pos",), op="Log"),
    Elementwise("sqrt", torch.sqrt, ("pos",), op="Sqrt"),
    Elementwise("rsqrt", torch.rsqrt, ("pos",)),
    Elementwise("pow_int", lambda x: x ** 3, ("real",), op="Pow"),
    Elementwise("pow_frac", lambda p: p ** 1.5, ("pos",), op="Pow"),
    Elementwise("pow_tensor", lambda p, y: p ** (y * 0.625), ("pos", "real"), op="Pow"),
    Elementwise("rpow", lambda x: 2.0 ** x, ("real",), op="Pow"),
    Elementwise("abs", lambda x: torch.abs(x) * x, ("real",), kinks=(0.0,), op="Abs"),
    Elementwise("sign", lambda x: torch.sign(x) * x * x, ("real",), op="Sign"),
    Elementwise("logit", torch.logit, ("prob",), op="Log"),
    Elementwise("neg_square", lambda x: -x * x, ("real",), op="Neg"),
    Elementwise("clamp", lambda x: x.clamp(-0.5, 1.0), ("real",), kinks=(-0.5, 1.0), op="Clip"),
    Elementwise("clamp_min_tensor", lambda x, y: torch.clamp(x, min=y), ("real", "real"), ties=True),
    Elementwise("floor", lambda x: torch.floor(x) * x, ("real",), kinks=INTEGERS, op="Floor"),
    Elementwise("ceil", lambda x: torch.ceil(x) * x, ("real",), kinks=INTEGERS, op="Ceil"),
    Elementwise("round", lambda x: torch.round(x) * x, ("real",), kinks=tuple(k + 0.5 for k in INTEGERS), op="Round"),
    Elementwise("fmod", lambda x: torch.fmod(x, 1.5), ("real",), kinks=MULTIPLES, op="Mod"),
    Elementwise("remainder", lambda x: torch.remainder(x, 1.5) * x, ("real",), kinks=MULTIPLES, op="Floor"),
    Elementwise("sin", torch.sin, ("real",), op="Sin"),
    Elementwise("cos", torch.cos, ("real",), op="Cos"),
    Elementwise("tan", torch.tan, ("unit",), op="Tan"),
    Elementwise("atan", torch.atan, ("real",), op="Atan"),
    Elementwise("asin_acos", lambda u: torch.asin(u) * torch.acos(u), ("unit",), op="Asin"),
    Elementwise("reciprocal", torch.reciprocal, ("pos",), op="Reciprocal"),
    Elementwise("erf", torch.erf, ("real",), op="Erf"),
    Elementwise("where", lambda x, y: torch.where(x > y, x * x, y * x), ("real", "real"), ties=True, op="Where"),
    Elementwise("maximum", torch.maximum, ("real", "real"), ties=True, op="Max"),
    Elementwise("minimum", torch.minimum, ("real", "real"), ties=True, op="Min"),
    Elementwise("arith_broadcast", lambda x, y: (x + y) * (x - y) / (y * y + 1), ("real", "real"), op="Div"),
    Elementwise("div_tensor", lambda x, p: x / p, ("real", "pos"), op="Div"),
    Elementwise("atan2", torch.atan2, ("real", "pos")),
    Elementwise("sigmoid_tanh", lambda x: torch.sigmoid(x) * torch.tanh(x), ("real",), op="Sigmoid"),
]
