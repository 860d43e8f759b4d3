"""onnxruntime's fused normalizations: SkipLayerNormalization, SkipSimplifiedLayerNormalization and
EmbedLayerNormalization (com.microsoft), and the two onnxruntime registers in the default domain below
opset 17: LayerNormalization (before ONNX had one) and SimplifiedLayerNormalization (RMS norm).

Statistics run in float32 for half inputs, as the kernels accumulate; mean and inv_std_var outputs
are float32 (their U type).
"""
from __future__ import annotations

import torch

from ..errors import OnnxGradError
from ..registry import describe, register, validates
from .inputs import bad_attribute
from .nn import _stash, layer_norm

MS = "com.microsoft"
ORT_LAYER_NORM = "onnxruntime's contrib LayerNormalization (the default domain had none before opset 17)"
ORT_RMS_NORM = "onnxruntime's RMS norm in the default domain: x / sqrt(mean(x²) + epsilon) · scale"


def _stats_dtype(x, float_dtype=None):
    return float_dtype or torch.promote_types(x.dtype, torch.float32)


@validates("SkipLayerNormalization", domain=MS)
@validates("SkipSimplifiedLayerNormalization", domain=MS)
def _skip_norm_inputs(ins, **_):
    """onnxruntime's skip_layer_norm_helper: skip broadcasts to the input, the rest are as wide as its hidden axis."""
    x = ins.rank("input", 2, 3, layout="batch, sequence, hidden or sequence, hidden")
    # skip is (B, S, H), (1, S, H) or (S, H): plain broadcasting covers every form the kernel accepts.
    ins.dim("skip", -1, x[-1], "the hidden size, input's last dim")
    ins.broadcasts("skip", x, "the input's shape")
    for name in ("gamma", "beta", "bias"):
        if name in ins:
            ins.width(name, x[-1], "the hidden size, input's last dim")


def _skip_sum(x, skip, bias):
    total = x + skip
    return total if bias is None else total + bias


@describe("SkipLayerNormalization", domain=MS, needs="in",
          rule=("dinput = (dŜ − mean(dŜ) − Ŝ · mean(dŜ · Ŝ)) / σ   with dŜ = dY · gamma, S = input + skip + bias",
                "dskip = dinput summed to skip's shape",
                "dgamma = Σ dY · Ŝ over the leading axes",
                "dbeta = Σ dY over the leading axes",
                "dbias = Σ dinput over the leading axes"))
@register("SkipLayerNormalization", domain=MS, since=1)
def skip_layer_norm(x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12, n_outputs=1, float_dtype=None):
    total = _skip_sum(x, skip, bias)
    work = total.to(_stats_dtype(x, float_dtype))
    mean = work.mean(-1, keepdim=True)
    inv_std = torch.rsqrt((work - mean).square().mean(-1, keepdim=True) + epsilon)
    y = ((work - mean) * inv_std * gamma.to(work.dtype))
    if beta is not None:
        y = y + beta.to(work.dtype)
    y = y.to(x.dtype)
    return y if n_outputs == 1 else (y, mean, inv_std, total)[:n_outputs]


@describe("SkipSimplifiedLayerNormalization", domain=MS, needs="in",
          rule=("dinput = (dŜ − Ŝ · mean(dŜ · Ŝ)) / rms   with dŜ = dY · gamma, Ŝ = S / rms, S = input + skip + bias",
                "dskip = dinput summed to skip's shape",
                "dgamma = Σ dY · Ŝ over the leading axes",
                "dbias = Σ dinput over the leading axes"))
@register("SkipSimplifiedLayerNormalization", domain=MS, since=1)
def skip_simplified_layer_norm(x, skip, gamma, bias=None, *, epsilon=1e-12, n_outputs=1, float_dtype=None):
    total = _skip_sum(x, skip, bias)
    work = total.to(_stats_dtype(x, float_dtype))
    inv_std = torch.rsqrt(work.square().mean(-1, keepdim=True) + epsilon)
    y = (work * inv_std * gamma.to(work.dtype)).to(x.dtype)
    if n_outputs == 1:
        return y
    # NOTE: the schema lists a mean output, but an RMS norm has none: the kernel writes zeros.
    return (y, torch.zeros_like(inv_std), inv_std, total)[:n_outputs]


@validates("LayerNormalization")
@validates("SimplifiedLayerNormalization")
def _norm_scale_inputs(ins, *, axis=-1, **_):
    """onnxruntime's layer_norm_helper: the scale and bias broadcast to the normalized dims, X.shape[axis:]."""
    x = ins.shape(ins.names[0])
    if not -len(x) <= axis < len(x):
        bad_attribute("axis", axis, f"in [{-len(x)}, {len(x)}) for X of rank {len(x)}")
    for name in ins.names[1:]:
        ins.broadcasts(name, x[axis:], f"the normalized dims, X's dims from axis {axis % len(x)}")


@register("LayerNormalization", since=1, until=16, note=ORT_LAYER_NORM)
def layer_norm_contrib(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1, n_outputs=1):
    return layer_norm(x, scale, b, axis=axis, epsilon=epsilon, stash_type=stash_type, n_outputs=n_outputs)


@describe("SimplifiedLayerNormalization", needs="in0,in1",
          rule=("dX = (dX̂ − X̂ · mean(dX̂ · X̂)) / rms   with dX̂ = dY · scale, X̂ = X / rms",
                "dscale = Σ dY · X̂ over the leading axes"))
@register("SimplifiedLayerNormalization", since=1, note=ORT_RMS_NORM)
def simplified_layer_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, n_outputs=1):
    axis = axis + x.dim() if axis < 0 else axis
    work = x.to(_stash(x, stash_type))
    inv_std = torch.rsqrt(work.square().mean(dim=tuple(range(axis, x.dim())), keepdim=True) + epsilon)
    y = (work * inv_std).to(x.dtype) * scale
    return y if n_outputs == 1 else (y, inv_std)[:n_outputs]


def _rows(op, table, ids, name):
    """table[ids], with onnxruntime's bounds check (the kernel refuses an index out of range)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise OnnxGradError(f"{op}: {name} holds an index outside [0, {table.shape[0]})")
    return table[ids.long()]


@validates("EmbedLayerNormalization", domain=MS)
def _embed_norm_inputs(ins, **_):
    """onnxruntime's embed_layer_norm_helper: ids (batch, sequence), tables (rows, hidden), gamma and beta (hidden)."""
    batch, seq = ins.rank("input_ids", 2, layout="batch, sequence")
    _, hidden = ins.rank("word_embedding", 2, layout="vocabulary, hidden")
    for name in ("position_embedding", "segment_embedding"):
        ins.rank(name, 2, layout="rows, hidden")
        ins.dim(name, 1, hidden, "the hidden size, word_embedding's dim 1")
    if ins.given("segment_ids") != ins.given("segment_embedding"):
        ins.fail("segment_ids" if not ins.given("segment_ids") else "segment_embedding",
                 "is missing: segment_ids and segment_embedding are given together or not at all")
    for name in ("segment_ids", "mask"):
        if ins.given(name) and ins.shape(name) != (batch, seq):
            ins.fail(name, f"expected input_ids' shape [{batch}, {seq}]")
    if ins.given("position_ids") and ins.shape("position_ids") not in ((batch, seq), (1, seq)):
        ins.fail("position_ids", f"expected [{batch}, {seq}] or [1, {seq}]")
    for name in ("gamma", "beta"):
        if not ins.given(name):
            ins.fail(name, "is required")
        ins.width(name, hidden, "the hidden size, word_embedding's dim 1")


@describe("EmbedLayerNormalization", domain=MS, needs="in",
          rule=(None,
                None,
                "dword_embedding = scatter-add of dE at input_ids   # dE: the LayerNorm backward of dY",
                "dposition_embedding = scatter-add of dE at the positions",
                "dsegment_embedding = scatter-add of dE at segment_ids",
                "dgamma = Σ dY · Ê over batch and sequence",
                "dbeta = Σ dY over batch and sequence",
                None,
                None))
@register("EmbedLayerNormalization", domain=MS, since=1)
def embed_layer_norm(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding=None, gamma=None,
                     beta=None, mask=None, position_ids=None, *, epsilon=1e-12, mask_index_type=1, n_outputs=1,
                     float_dtype=None):
    op = "EmbedLayerNormalization"
    batch, seq = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device).reshape(1, seq)
    total = _rows(op, word_embedding, input_ids, "input_ids") + _rows(op, position_embedding, position_ids,
                                                                       "the positions")
    if segment_ids is not None:
        total = total + _rows(op, segment_embedding, segment_ids, "segment_ids")
    work = total.to(_stats_dtype(total, float_dtype))
    mean = work.mean(-1, keepdim=True)
    y = (work - mean) * torch.rsqrt((work - mean).square().mean(-1, keepdim=True) + epsilon)
    y = (y * gamma.to(work.dtype) + beta.to(work.dtype)).to(total.dtype)
    if n_outputs == 1:
        return y
    # NOTE: the kernel's mask_index counts the entries equal to 1 (not the nonzero ones); no mask gives zeros.
    if mask is None:
        mask_index = torch.zeros(batch, dtype=torch.int32, device=input_ids.device)
    else:
        mask_index = (mask == 1).sum(-1).to(torch.int32)
    return (y, mask_index, total)[:n_outputs]
