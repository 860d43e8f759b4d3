"""NNSmith's graphs swept selection by selection, for the tests and benchmarks/bench_mutants.py:
the default check with whether the engine's float64 gradient agrees with torch autograd through
NNSmith's own module, and the mutation suite's report."""
from __future__ import annotations

from typing import Iterator

import engine
from engine.conformance.mutation import run_mutants
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


def mutated_selections(seeds, dtypes, modes) -> Iterator[tuple[int, object, str, list, list, object]]:
    """(seed, graph, y, xs, zs, the mutation report in `modes`) for every selection of every graph."""
    for seed in seeds:
        graph = ng.generate(seed, dtypes=dtypes)
        if graph is None:
            continue
        proto = graph.proto
        for y, xs, zs in ng.selections(graph):
            yield seed, graph, y, xs, zs, run_mutants(lambda proto=proto: engine.load(proto), y, xs, zs, graph.feeds,
                                                      modes=modes)
