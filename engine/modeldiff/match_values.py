"""Matching by value, where the caller has run both models: an A tensor that neither names nor graph
position could match is matched to the one unmatched B tensor of the same shape holding the same numbers
(within `rtol` of the values' scale). Two such B tensors, or a constant-looking value (all equal), match
nothing. Torch-free: the values are numpy arrays (or anything numpy reads)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .match_walk import WalkState

_PROBES = 16


def _signature(v: np.ndarray) -> tuple[tuple[int, ...], np.ndarray] | None:
    if v.size < 2 or v.dtype.kind not in "fiucb":
        return None
    flat = v.reshape(-1).astype(np.float64)
    if not np.all(np.isfinite(flat)) or np.ptp(flat) == 0:
        return None  # all equal (zeros, ones, a splatted constant): many tensors hold that
    picks = flat[np.linspace(0, flat.size - 1, _PROBES).astype(np.int64)]
    return v.shape, picks


def _close(x: np.ndarray, y: np.ndarray, rtol: float) -> bool:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(float(np.max(np.abs(x))), float(np.max(np.abs(y))), 1e-30)
    return float(np.max(np.abs(x - y))) <= rtol * scale


def match_by_value(s: WalkState, values_a: Mapping, values_b: Mapping, rtol: float) -> int:
    """Pairs made (each A tensor to the single close B tensor, each B tensor claimed once)."""
    def candidates(g, values, matched) -> dict:
        out = {}
        for t in values:
            if t in matched or t in g.initializers or t not in g.producer:
                continue
            sig = _signature(np.asarray(values[t]))
            if sig is not None:
                out[t] = sig
        return out

    left_a = candidates(s.a, values_a, s.tensors)
    left_b = candidates(s.b, values_b, s.taken)
    by_shape: dict[tuple, list[str]] = {}
    for t, (shape, _) in left_b.items():
        by_shape.setdefault(shape, []).append(t)
    found: dict[str, list[str]] = {}
    for ta, (shape, probes) in left_a.items():
        near = [tb for tb in by_shape.get(shape, ()) if _close(probes, left_b[tb][1], rtol)]
        found[ta] = [tb for tb in near if _close(values_a[ta], values_b[tb], rtol)]
    claims: dict[str, int] = {}
    for near in found.values():
        for tb in near:
            claims[tb] = claims.get(tb, 0) + 1
    made = 0
    for ta, near in found.items():
        if len(near) == 1 and claims[near[0]] == 1:
            made += s.pair(ta, near[0])
    return made
