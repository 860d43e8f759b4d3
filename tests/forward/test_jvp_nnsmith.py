"""J·v on NNSmith's random graphs against torch.func.jvp on the torch module NNSmith generates with each
graph (float64 ≤ 1e-6, float32 ≤ 1e-4 in relative L2), and the transpose identity ⟨u, J v⟩ = ⟨Jᵀu, v⟩
between the engine's forward and reverse modes on every selection."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("nnsmith")

import engine  # noqa: E402
from tests import nnsmith_graphs as ng  # noqa: E402

SWEEP = range(30)


@pytest.fixture(scope="module")
def graphs() -> dict[int, ng.RandomGraph]:
    made = {}
    for seed in SWEEP:
        try:
            made[seed] = ng.generate(seed)
        except Exception:  # nnsmith's own sanity checks, rarely, on a seed: that graph is not judged
            made[seed] = None
    return {seed: g for seed, g in made.items() if g is not None}


def rel(got, want) -> float:
    got, want = np.ravel(np.asarray(got, np.float64)), np.ravel(np.asarray(want, np.float64))
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def torch_jvp(g, y, xs, tangents, dtype):
    f = ng.torch_function(g, y, xs, dtype)
    values = tuple(ng.torch_values(g, xs, dtype))
    try:
        _, out = torch.func.jvp(f, values, tuple(torch.from_numpy(tangents[x]).to(dtype) for x in xs))
    except NotImplementedError:  # torch has no forward rule for one of the module's ops
        return None
    return out.detach().numpy()


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-6), (torch.float32, 1e-4)], ids=["f64", "f32"])
def test_jvp_matches_torch_func_jvp_and_the_transpose_identity_holds(graphs, dtype, bound):
    judged, nonzero, failures, refused = 0, 0, {}, []
    name = str(dtype).removeprefix("torch.")
    for g in graphs.values():
        model = engine.load(g.onnx)
        for y, xs, zs in ng.selections(g):
            feeds = {k: v for k, v in g.feeds.items() if k not in xs}
            values = dict(zip(xs, (v.numpy() for v in ng.torch_values(g, xs, torch.float64))))
            feeds.update({x: values[x] for x in xs if x in g.feeds})
            try:
                got = model.jvp(y, xs, "random", zs, feeds=feeds, dtype=name, seed=g.seed)
            except engine.ForwardModeError as exc:
                refused.append((g.seed, y, str(exc)))
                continue
            want = torch_jvp(g, y, xs, got.tangents, dtype)
            if want is None or not np.isfinite(want).all():
                continue
            judged += 1
            nonzero += bool(np.abs(want).max(initial=0) > 0)
            if rel(got.jvp, want) > bound:
                failures[(g.seed, y)] = (rel(got.jvp, want), g.ops)
            # the transpose identity, in float64 whatever the run's dtype
            if dtype == torch.float64:
                u = np.random.default_rng(g.seed).standard_normal(got.jvp.shape)
                rev = model.gradient(y, xs, zs, feeds=feeds, dy=u, dtype="float64", seed=g.seed)
                left = float((u * got.jvp).sum())
                right = sum(float((rev.grads[x] * got.tangents[x]).sum()) for x in xs)
                # rounding in either sum is relative to the norms of what was multiplied; a gradient that
                # cancels to ~1e-17 (Round, Min ties) is rounding of unit-sized terms: |u||v| bounds it
                scale = np.linalg.norm(u) * np.linalg.norm(got.jvp) + sum(
                    np.linalg.norm(rev.grads[x]) * np.linalg.norm(got.tangents[x]) for x in xs) \
                    + 1e-6 * np.linalg.norm(u) * sum(np.linalg.norm(got.tangents[x]) for x in xs)
                if abs(left - right) > 1e-9 * scale:
                    failures[(g.seed, y, "transpose")] = (left, right, g.ops)
    assert not refused, refused  # torch covers every op NNSmith generates
    assert not failures, failures
    assert judged > 40 and nonzero > 30, (judged, nonzero)
