"""Losses at the end of a training graph: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
(what torch exports for F.nll_loss and F.cross_entropy), over (N, C) or (N, C, d1, ..., dk) scores."""
from __future__ import annotations

import torch

from ..errors import InputShapeError, OnnxGradError, UnsupportedOpError
from ..registry import describe, register

REDUCTIONS = ("none", "sum", "mean")


def _nll(log_prob, target, weight, reduction, ignore_index):
    """-log_prob[n, target[n, d...], d...] weighted per class; the mean divides by the total weight."""
    if reduction not in REDUCTIONS:
        raise UnsupportedOpError(f"loss reduction {reduction!r} is not supported (use none, sum or mean)")
    if log_prob.dim() < 2 or target.dim() != log_prob.dim() - 1:
        raise OnnxGradError(f"loss: scores {list(log_prob.shape)} need shape (N, C, d...) and target (N, d...), "
                            f"got target {list(target.shape)}")
    target = target.to(torch.int64)
    kept = None if ignore_index is None else target != ignore_index
    safe = target if kept is None else torch.where(kept, target, torch.zeros_like(target))
    _labels_in_range(safe, target, log_prob.shape[1], ignore_index)
    picked = -torch.gather(log_prob, 1, safe.unsqueeze(1)).squeeze(1)
    w = None if weight is None else weight[safe].to(log_prob.dtype)
    if kept is not None:
        mask = kept.to(log_prob.dtype)
        w = mask if w is None else w * mask
    loss = picked if w is None else picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    # NOTE: with every target ignored the mean is 0/0 = nan, as in torch and the ONNX reference.
    return loss.mean() if w is None else loss.sum() / w.sum()


def _labels_in_range(safe, target, classes: int, ignore_index) -> None:
    """A label outside the classes is a gather past the scores: refused naming it and ignore_index, which
    the label may have been meant to equal (onnxruntime: 'Target ... is out of bounds')."""
    bad = (safe < 0) | (safe >= classes)
    if safe.numel() and bool(bad.any()):
        at = [int(i) for i in bad.nonzero()[0]]
        ignored = "no ignore_index is set" if ignore_index is None else f"is not ignore_index = {ignore_index}"
        raise InputShapeError(f"label {int(target[tuple(at)])} at {at} is outside [0, {classes}) and {ignored}")


@describe("NegativeLogLikelihoodLoss", needs="in",
          rule=("dinput = −dY · weight[target] at each sample's target class, 0 elsewhere   # ÷ Σ weights for reduction=mean",
                None,
                "dweight = per class: −Σ dY · input at its samples' targets (the mean's quotient rule included)"))
@register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    return _nll(x, target, weight, reduction, ignore_index)


@describe("SoftmaxCrossEntropyLoss", needs="in",
          rule=("dscores = dY · weight · (softmax(scores) − onehot(labels))   # ÷ Σ weights for reduction=mean",
                None,
                "dweights = per class: its samples' −log p at their labels (the mean's quotient rule included)"))
@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean",
                               n_outputs=1):
    log_prob = torch.log_softmax(scores, dim=1)
    loss = _nll(log_prob, labels, weights, reduction, ignore_index)
    return loss if n_outputs == 1 else (loss, log_prob)
