"""The model's per-selection caches keep the most recently used entries, not every one ever asked."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import model as model_module
from engine.run.recent import Recent
from tests.big_models import residual_chain


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(1, 6), keys=st.lists(st.integers(0, 9), max_size=40))
def test_recent_keeps_the_most_recently_used(limit, keys):
    cache, order = Recent(limit), []  # order: the oracle, least recent first
    for k in keys:
        if cache.get(k) is None:
            cache[k] = str(k)
        order = [o for o in order if o != k] + [k]
        assert list(cache) == order[-limit:]
        assert all(cache[o] == str(o) for o in cache)


def test_a_long_session_of_single_tensor_requests_keeps_a_bounded_number_of_plans():
    m = engine.load(residual_chain(40))
    (x,) = m.inputs
    feeds = {x: np.ones([d or 1 for d in m.graph.types[x].shape], np.float32)}
    tensors = [t for node in m.graph.nodes for t in node.output][:model_module.PLANS_KEPT + 30]
    first = m.prepare([x], [tensors[0]])
    for t in tensors:
        value = m.run(feeds, outputs=[t])[t]
        assert np.isfinite(value).all()
    assert len(m._plans) <= model_module.PLANS_KEPT
    last = m.prepare([x], [tensors[-1]])
    assert m.prepare([x], [tensors[-1]]) is last  # a recent plan is reused, not rebuilt
    assert m.prepare([x], [tensors[0]]) is not first  # the oldest was let go, and is built again
