"""The default check over NNSmith's graphs, each selection with whether the engine's float64
gradient agrees with torch autograd through NNSmith's own module (the test and the benchmark's
sweep of unmutated graphs)."""
from __future__ import annotations

from typing import Iterator

import engine
from tests import nnsmith_graphs as ng


def checked_selections(seeds, dtypes) -> Iterator[tuple[int, str, object, bool]]:
    """(seed, y, the default check's report, whether engine and torch agree on every x)."""
    for seed in seeds:
        graph = ng.generate(seed, dtypes=dtypes)
        if graph is None:
            continue
        agree = ng.engine_gradient_matches_torch(graph)
        model = engine.load(graph.proto)
        for y, xs, zs in ng.selections(graph):
            report = engine.check(model, y, xs, zs, feeds=graph.feeds)
            yield seed, y, report, all((y, x) not in agree.failures for x in xs)
