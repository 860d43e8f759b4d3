"""Claimed gradients: a tensor the model computes itself (a Gradient node's output, an exported
backward graph) checked against the engine's VJP and against finite differences.

The claim is taken to be the gradient of sum(y) (the Gradient operator's convention), or of
<dy, y> when dy is given; check() seeds with ones for that reason when claims are present.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from ..errors import FeedError, OnnxGradError
from .report import ClaimedCheck
from .status import FAIL, INCONCLUSIVE, PASS
from .verdict import ATOL_REL, RTOL


def parse_claimed(claimed) -> dict[str, str]:
    """{x: output} from a mapping, "X=OUT" strings, or (x, out) pairs."""
    if not claimed:
        return {}
    if isinstance(claimed, Mapping):
        pairs = list(claimed.items())
    else:
        pairs = []
        for item in ([claimed] if isinstance(claimed, str) else claimed):
            if isinstance(item, str):
                if "=" not in item or not all(p.strip() for p in item.split("=", 1)):
                    raise OnnxGradError(f"bad claimed gradient {item!r}: write X=OUT (x in xs, OUT a model tensor)")
                x, out = item.split("=", 1)
                pairs.append((x.strip(), out.strip()))
            else:
                pairs.append(tuple(item))
    result: dict[str, str] = {}
    for x, out in pairs:
        if x in result:
            raise OnnxGradError(f"claimed gradient for {x!r} given twice")
        result[str(x)] = str(out)
    return result


def claimed_values(ctx, claimed: dict[str, str]) -> dict[str, torch.Tensor]:
    """Run the model (float64) to the claimed outputs, from xs ∪ zs and every fed tensor."""
    model = ctx.model
    for x, out in claimed.items():
        if not model.graph.has_tensor(out):
            raise OnnxGradError(f"claimed gradient {out!r} (for {x!r}) is not a tensor of this model"
                                f"{model.graph.did_you_mean(out)}")
    extra = tuple(n for n in ctx.feeds if n not in ctx.sources)
    sources = ctx.sources + extra
    outputs = list(dict.fromkeys(claimed.values()))
    plan = model.prepare(sources, outputs, device=ctx.device, dtype=torch.float64)
    tensors = ctx.tensors64 + [model.to_tensor(n, ctx.feeds[n], ctx.device, torch.float64) for n in extra]
    try:
        with torch.no_grad():
            values = plan.run(tensors)
    except FeedError as exc:
        raise FeedError(f"computing the claimed gradients: {exc}") from None
    return dict(zip(outputs, values))


def check_claimed(ctx, claimed: dict[str, str], probes: dict, opts) -> tuple[ClaimedCheck, ...]:
    values = claimed_values(ctx, claimed)
    results = []
    rtol = RTOL if opts.rtol is None else opts.rtol
    for x, out in claimed.items():
        engine = ctx.grads64[x]
        value = values[out]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(engine.shape):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            results.append(ClaimedCheck(x, out, FAIL, None, None, None, None, None, None, None, None,
                                        f"{out!r} has shape {shape} but {x!r} has shape {tuple(engine.shape)}"))
            continue
        value = value.to(torch.float64)
        results.append(_judge(x, out, value, engine, probes.get(x), opts, rtol))
    return tuple(results)


def _judge(x, out, value, engine, probe, opts, rtol) -> ClaimedCheck:
    if engine.numel() == 0:
        return ClaimedCheck(x, out, PASS, None, None, None, None, None, None, None, None,
                            f"skipped: empty ({x!r} has no elements)")
    a, b = value.reshape(-1).cpu().numpy(), engine.reshape(-1).cpu().numpy()
    scale = float(np.max(np.minimum(np.abs(a), np.abs(b)), initial=0.0))
    atol = ATOL_REL * scale if opts.atol is None else opts.atol
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-300)
    bad_engine = (diff > atol) & (rel > rtol) | ~np.isfinite(a)
    worst = int(np.argmax(np.where(np.isfinite(diff), diff, np.inf))) if diff.size else 0
    abs_e = float(diff.max()) if diff.size else 0.0
    rel_e = float(rel.max()) if rel.size else 0.0
    status, reasons = PASS, []
    if bad_engine.any():
        status = FAIL
        i = int(np.argmax(np.where(bad_engine, np.nan_to_num(diff, nan=np.inf), -1)))
        worst = i
        reasons.append(f"{int(bad_engine.sum())} of {a.size} elements differ from the engine's gradient "
                       f"(worst at {[int(k) for k in np.unravel_index(i, tuple(engine.shape))]}: claimed {a[i]:.6g}, "
                       f"engine {b[i]:.6g})")
    fd_abs = fd_rel = numeric = None
    if probe is not None:
        v = probe.judge(value)
        conclusive = (v.status == PASS) | (v.status == FAIL)
        if conclusive.any():
            fd_abs, fd_rel = float(v.abs_err[conclusive].max()), float(v.rel_err[conclusive].max())
        n_fail = int(np.sum(v.status == FAIL))
        if n_fail:
            status = FAIL
            reasons.append(f"{n_fail} checked items disagree with finite differences")
        elif np.any(v.status == INCONCLUSIVE) and status == PASS:
            status = INCONCLUSIVE
            reasons.append("finite differences were inconclusive at some items (see the x's result)")
        item = _item_of(probe, worst)
        if item is not None:
            numeric = float(v.numeric[item])
    index = tuple(int(i) for i in np.unravel_index(worst, tuple(engine.shape))) if engine.dim() else ()
    return ClaimedCheck(x, out, status, abs_e, rel_e, fd_abs, fd_rel, index, float(a[worst]), float(b[worst]),
                        numeric, "; ".join(reasons))


def _item_of(probe, flat_index: int) -> int | None:
    """The probe's item for an element of x, if that element was among those checked."""
    if probe.pert.kind != "elements":
        return None
    hits = np.nonzero(probe.pert.elements.reshape(-1).cpu().numpy() == flat_index)[0]
    return int(hits[0]) if len(hits) and probe.m.evaluated[hits[0]] else None
