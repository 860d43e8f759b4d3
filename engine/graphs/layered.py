"""A pure-Python layered (Sugiyama-style) placement, for when Graphviz is not installed.

1. ranks by longest path from the sources, then each node moved down to just above its first
   consumer;
2. every edge longer than one rank gets a virtual item per rank it crosses;
3. items ordered within ranks by barycenter sweeps (components kept apart);
4. x centres by isotonic regression toward the neighbours' mean, which keeps the order and the
   spacing while moving each item as little as possible.

Everything is O(items) per sweep, so ~2,000 nodes take well under a second.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable, Sequence

Item = Hashable  # a node id (str) or a virtual item (edge index, rank)


def assign_ranks(ids: Sequence[str], edges: Sequence[tuple[str, str]],
                 same_rank: Sequence[Sequence[str]] = ()) -> dict[str, int]:
    succ: dict[str, list[str]] = {i: [] for i in ids}
    pred: dict[str, list[str]] = {i: [] for i in ids}
    indegree = dict.fromkeys(ids, 0)
    for s, t in edges:
        succ[s].append(t)
        pred[t].append(s)
        indegree[t] += 1
    ready = deque(i for i in ids if indegree[i] == 0)
    order = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for t in succ[n]:
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    if len(order) < len(ids):  # not a DAG: rank what is left in input order, ignoring back edges
        placed = set(order)
        order += [i for i in ids if i not in placed]
    position = {n: k for k, n in enumerate(order)}
    rank: dict[str, int] = {}
    for n in order:
        rank[n] = max((rank[p] + 1 for p in pred[n] if position[p] < position[n]), default=0)
    # As late as the consumers allow: a weight's little subgraph sits just above where it is used
    # instead of at the top with a long edge down to it.
    for n in reversed(order):
        later = [rank[t] for t in succ[n] if position[t] > position[n]]
        if later:
            rank[n] = max(rank[n], min(later) - 1)
    if same_rank:  # a group joins its lowest member; whatever follows moves down to make room
        for group in same_rank:
            low = max(rank[n] for n in group)
            for n in group:
                rank[n] = low
        for n in order:
            rank[n] = max([rank[n]] + [rank[p] + 1 for p in pred[n] if position[p] < position[n]])
    return rank


def build_layers(ids: Sequence[str], edges: Sequence[tuple[str, str]], rank: dict[str, int]):
    """Layers of items in first-seen order, plus each item's neighbours one rank up and down."""
    n_ranks = max(rank.values(), default=-1) + 1
    layers: list[list[Item]] = [[] for _ in range(n_ranks)]
    up: dict[Item, list[Item]] = {}
    down: dict[Item, list[Item]] = {}
    for n in ids:
        layers[rank[n]].append(n)
        up[n], down[n] = [], []
    chains: dict[int, list[Item]] = {}
    for k, (s, t) in enumerate(edges):
        rs, rt = rank[s], rank[t]
        if rt <= rs:
            continue  # a back or flat edge: routed without virtual items
        chain: list[Item] = [s]
        for r in range(rs + 1, rt):
            v = (k, r)
            layers[r].append(v)
            up[v], down[v] = [], []
            chain.append(v)
        chain.append(t)
        for a, b in zip(chain, chain[1:]):
            down[a].append(b)
            up[b].append(a)
        chains[k] = chain[1:-1]
    return layers, up, down, chains


def components(layers, up, down) -> dict[Item, int]:
    comp: dict[Item, int] = {}
    count = 0
    for layer in layers:
        for start in layer:
            if start in comp:
                continue
            stack = [start]
            comp[start] = count
            while stack:
                item = stack.pop()
                for nxt in up[item] + down[item]:
                    if nxt not in comp:
                        comp[nxt] = count
                        stack.append(nxt)
            count += 1
    return comp


def order_layers(layers, up, down, comp, sweeps: int = 4) -> None:
    """Barycenter sweeps, in place: down using the rank above, then up using the rank below."""
    pos: dict[Item, float] = {}
    for layer in layers:
        layer.sort(key=lambda item: comp[item])
        for k, item in enumerate(layer):
            pos[item] = k
    for sweep in range(sweeps):
        downward = sweep % 2 == 0
        rng = range(1, len(layers)) if downward else range(len(layers) - 2, -1, -1)
        for r in rng:
            layer = layers[r]
            keys = {}
            for item in layer:
                nbrs = up[item] if downward else down[item]
                keys[item] = (comp[item], sum(pos[n] for n in nbrs) / len(nbrs) if nbrs else pos[item])
            layer.sort(key=keys.__getitem__)
            for k, item in enumerate(layer):
                pos[item] = k


def isotonic_place(desired: list[float], widths: list[float], weights: list[float], sep: float) -> list[float]:
    """Left edges closest (weighted least squares) to `desired` with left[i+1] >= left[i] + w[i] + sep."""
    offsets, acc = [], 0.0
    for w in widths:
        offsets.append(acc)
        acc += w + sep
    # Pool adjacent violators on targets shifted by the offsets: a non-decreasing fit.
    blocks: list[list[float]] = []  # [mean, weight, count]
    for d, o, wt in zip(desired, offsets, weights):
        blocks.append([d - o, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out = []
    for mean, _, count in blocks:
        out.extend([mean] * count)
    return [v + o for v, o in zip(out, offsets)]


def place_x(layers, up, down, width_of, sep: float = 2.0, passes: int = 6) -> dict[Item, float]:
    """Centre x of every item: packed left to right, then pulled toward its neighbours.

    Every pass pulls an item toward all its neighbours, above and below: pulling toward one side
    only lets a long chain drift a few columns sideways per rank (a 12,500-rank backward graph
    became 6,000 columns wide).
    """
    centre: dict[Item, float] = {}
    rows = []  # per layer: items, widths, weights, neighbours (fixed across passes)
    for layer in layers:
        x = 0.0
        widths = [width_of(item) for item in layer]
        for item, w in zip(layer, widths):
            centre[item] = x + w / 2
            x += w + sep
        # Virtual items weigh more: long edges come out straight.
        weights = [4.0 if isinstance(item, tuple) else 1.0 for item in layer]
        rows.append((layer, widths, weights, [up[item] + down[item] for item in layer]))
    for p in range(passes):
        order = rows if p % 2 == 0 else rows[::-1]
        for layer, widths, weights, nbrs in order:
            if len(layer) == 1:  # nothing to keep apart: straight to the neighbours' mean
                ns = nbrs[0]
                if ns:
                    centre[layer[0]] = sum(centre[n] for n in ns) / len(ns)
                continue
            desired = [(sum([centre[n] for n in ns]) / len(ns) if ns else centre[item]) - w / 2
                       for item, w, ns in zip(layer, widths, nbrs)]
            if len(layer) == 2:  # the common case (a node beside a long edge), solved in place
                (a, b), (wa, wb), gap = desired, weights, widths[0] + sep
                lefts = (a, b) if b >= a + gap else ((left := (wa * a + wb * (b - gap)) / (wa + wb)), left + gap)
            else:
                lefts = isotonic_place(desired, widths, weights, sep)
            for item, left, w in zip(layer, lefts, widths):
                centre[item] = left + w / 2
    return centre
