"""A pure-Python layered (Sugiyama-style) placement, for when Graphviz is not installed.

1. ranks by longest path from the sources, then each node moved down to just above its first
   consumer;
2. every edge longer than one rank gets a virtual item per rank it crosses;
3. items ordered within ranks by barycenter sweeps (components kept apart);
4. x centres by isotonic regression toward the neighbours' mean, which keeps the order and the
   spacing while moving each item as little as possible.

Nodes are the integers 0..n-1 and virtual items follow them, so every table is a flat list
indexed by item: a 12,500-node chain is placed in a fraction of a second, where dicts keyed by
ids and tuples spent most of the time hashing. Each step is O(items) per sweep.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ..run.pacing import paced, pause_point

Edge = tuple[int, int]
VIRTUAL_WEIGHT = 4.0  # virtual items pull harder than nodes: long edges come out straight
LONE, LONE_2, PAIR, PAIR_2, ROW = "lone", "lone2", "pair", "pair2", "row"  # kinds of x-placement step


@dataclass(frozen=True)
class Placement:
    """Where the layered placement put things: ranks and x centres, in cells."""

    rank: list[int]  # per node
    centre: list[float]  # per node
    chains: dict[int, list[float]]  # edge index -> x centre of its virtual item on each rank it crosses


def place(widths: Sequence[int], edges: Sequence[Edge], same_rank: Sequence[Sequence[int]] = (),
          sep: float = 2.0) -> Placement:
    """Nodes 0..len(widths)-1 of the given widths, edges as (source, target) index pairs."""
    n = len(widths)
    rank = assign_ranks(n, edges, same_rank)
    layers, up, down, chains = build_layers(n, edges, rank)
    order_layers(layers, up, down, components(layers, up, down))
    item_widths = list(widths) + [1] * (len(up) - n)
    centre = place_x(layers, up, down, item_widths, n, sep=sep)
    return Placement(rank, centre[:n], {k: [centre[v] for v in chain] for k, chain in chains.items()})


def assign_ranks(n: int, edges: Sequence[Edge], same_rank: Sequence[Sequence[int]] = ()) -> list[int]:
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for s, t in edges:
        succ[s].append(t)
        pred[t].append(s)
        indegree[t] += 1
    ready = deque(i for i in range(n) if indegree[i] == 0)
    order = []
    while ready:
        v = ready.popleft()
        order.append(v)
        for t in succ[v]:
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    acyclic = len(order) == n
    if not acyclic:  # rank what is left in input order, ignoring back edges
        placed = set(order)
        order += [i for i in range(n) if i not in placed]
    position = [0] * n
    for k, v in enumerate(order):
        position[v] = k
    rank = [0] * n

    def longest_paths():
        for v in paced(order, 1024):
            ps = pred[v]
            if acyclic:  # every predecessor comes earlier in the order
                rank[v] = max([rank[p] for p in ps]) + 1 if ps else 0
            else:
                pv = position[v]
                rank[v] = max([rank[p] + 1 for p in ps if position[p] < pv], default=0)

    longest_paths()
    # As late as the consumers allow: a weight's little subgraph sits just above where it is used
    # instead of at the top with a long edge down to it.
    for v in paced(reversed(order), 1024):
        ts = succ[v]
        if not ts:
            continue
        if acyclic:
            first = min([rank[t] for t in ts]) - 1
        else:
            pv = position[v]
            first = min([rank[t] for t in ts if position[t] > pv], default=0) - 1
        if first > rank[v]:
            rank[v] = first
    if same_rank:  # a group joins its lowest member; whatever follows moves down to make room
        for group in same_rank:
            low = max(rank[v] for v in group)
            for v in group:
                rank[v] = low
        for v in order:
            pv = position[v]
            rank[v] = max([rank[v]] + [rank[p] + 1 for p in pred[v] if position[p] < pv])
    return rank


def build_layers(n: int, edges: Sequence[Edge], rank: list[int]):
    """Layers of items (nodes in index order, then virtual items in edge order), each item's
    neighbours one rank up and down, and each long edge's chain of virtual items."""
    layers: list[list[int]] = [[] for _ in range(max(rank, default=-1) + 1)]
    for v in range(n):
        layers[rank[v]].append(v)
    up: list[list[int]] = [[] for _ in range(n)]
    down: list[list[int]] = [[] for _ in range(n)]
    chains: dict[int, list[int]] = {}
    for k, (s, t) in enumerate(edges):
        if not k & 255:
            pause_point()
        rs, rt = rank[s], rank[t]
        if rt <= rs:
            continue  # a back or flat edge: routed without virtual items
        if rt == rs + 1:
            down[s].append(t)
            up[t].append(s)
            continue
        prev = s
        chain = []
        for r in range(rs + 1, rt):
            v = len(up)
            layers[r].append(v)
            up.append([prev])
            down.append([])
            down[prev].append(v)
            chain.append(v)
            prev = v
        down[prev].append(t)
        up[t].append(prev)
        chains[k] = chain
    return layers, up, down, chains


def components(layers, up, down) -> list[int]:
    """Component number of every item, numbered by first appearance going down the layers."""
    comp = [-1] * len(up)
    count = 0
    for layer in layers:
        pause_point()
        for start in layer:
            if comp[start] >= 0:
                continue
            stack = [start]
            comp[start] = count
            while stack:
                item = stack.pop()
                for nbrs in (up[item], down[item]):
                    for nxt in nbrs:
                        if comp[nxt] < 0:
                            comp[nxt] = count
                            stack.append(nxt)
            count += 1
    return comp


def order_layers(layers, up, down, comp, sweeps: int = 4) -> None:
    """Barycenter sweeps, in place: down using the rank above, then up using the rank below.

    Ties keep the current order (a stable sort), so the result is deterministic.
    """
    pos = [0] * len(up)
    split = max(comp, default=0) > 0  # several components: each kept in its own block
    for layer in layers:
        if split and len(layer) > 1:
            layer.sort(key=comp.__getitem__)
        for k, item in enumerate(layer):
            pos[item] = k
    busy = [r for r, layer in enumerate(layers) if len(layer) > 1]  # a lone item has one place
    unchanged = 0  # sweeps in a row that moved nothing: two (one each way) and the order is final
    for sweep in range(sweeps):
        downward = sweep % 2 == 0
        nbrs_of = up if downward else down
        moved = False
        for r in busy if downward else reversed(busy):
            if r == 0 and downward or r == len(layers) - 1 and not downward:
                continue  # no rank on that side to follow
            pause_point()
            layer = layers[r]
            keys = []
            for item in layer:
                nbrs = nbrs_of[item]
                bary = sum(map(pos.__getitem__, nbrs)) / len(nbrs) if nbrs else pos[item]
                keys.append((comp[item], bary) if split else bary)
            if len(layer) == 2:  # the common case, without a sort
                if keys[1] < keys[0]:
                    a, b = layer
                    layer[0], layer[1], pos[b], pos[a] = b, a, 0, 1
                    moved = True
                continue
            new = [layer[k] for k in sorted(range(len(layer)), key=keys.__getitem__)]
            if new != layer:
                layer[:] = new
                for k, item in enumerate(layer):
                    pos[item] = k
                moved = True
        unchanged = 0 if moved else unchanged + 1
        if unchanged == 2:
            break


def isotonic_place(desired: list[float], widths: list[float], weights: list[float], sep: float) -> list[float]:
    """Left edges closest (weighted least squares) to `desired` with left[i+1] >= left[i] + w[i] + sep."""
    offsets, acc = [], 0.0
    for w in widths:
        offsets.append(acc)
        acc += w + sep
    # Pool adjacent violators on targets shifted by the offsets: a non-decreasing fit. The blocks
    # are three flat lists (mean, weight, count): a list per block would cost a third of a big layout.
    means: list[float] = []
    totals: list[float] = []
    counts: list[int] = []
    for d, o, wt in zip(desired, offsets, weights):
        mean, count = d - o, 1
        while means and means[-1] > mean:
            m1, w1 = means.pop(), totals.pop()
            mean, wt, count = (m1 * w1 + mean * wt) / (w1 + wt), w1 + wt, count + counts.pop()
        means.append(mean)
        totals.append(wt)
        counts.append(count)
    out = []
    for mean, count in zip(means, counts):
        out.extend([mean] * count)
    return [v + o for v, o in zip(out, offsets)]


def place_x(layers, up, down, widths: list[int], n_nodes: int, sep: float = 2.0, passes: int = 6) -> list[float]:
    """Centre x of every item: packed left to right, then pulled toward its neighbours.

    Every pass pulls an item toward all its neighbours, above and below: pulling toward one side
    only lets a long chain drift a few columns sideways per rank (a 12,500-rank backward graph
    would be 6,000 columns wide). Items are virtual from index n_nodes on.
    """
    centre = [0.0] * len(up)
    steps = _packed(layers, [u + d for u, d in zip(up, down)], widths, n_nodes, sep, centre)
    for p in range(passes):
        for step in paced(steps if p % 2 == 0 else reversed(steps), 16):
            kind = step[0]
            if kind is LONE_2:
                _, item, a, b = step
                centre[item] = (centre[a] + centre[b]) / 2
            elif kind is PAIR_2 or kind is PAIR:
                if kind is PAIR_2:
                    _, a, b, ha, hb, wa, wb, gap, a1, a2, b1, b2 = step
                    da = (centre[a1] + centre[a2]) / 2 - ha
                    db = (centre[b1] + centre[b2]) / 2 - hb
                else:
                    _, a, b, ha, hb, wa, wb, gap, na, nb = step
                    da = (sum(map(centre.__getitem__, na)) / len(na) if na else centre[a]) - ha
                    db = (sum(map(centre.__getitem__, nb)) / len(nb) if nb else centre[b]) - hb
                if db < da + gap:
                    da = (wa * da + wb * (db - gap)) / (wa + wb)
                    db = da + gap
                centre[a], centre[b] = da + ha, db + hb
            elif kind is LONE:
                _, item, ns = step
                centre[item] = sum(map(centre.__getitem__, ns)) / len(ns)
            else:
                _, layer, ws, weights, ns_list = step
                desired = [(sum(map(centre.__getitem__, ns)) / len(ns) if ns else centre[item]) - w / 2
                           for item, w, ns in zip(layer, ws, ns_list)]
                for item, left, w in zip(layer, isotonic_place(desired, ws, weights, sep), ws):
                    centre[item] = left + w / 2
    return centre


def _packed(layers, nbrs: list, widths: list[int], n_nodes: int, sep: float, centre: list[float]) -> list[tuple]:
    """Every layer packed left to right into `centre`; the steps of place_x's passes, one per layer
    in rank order: a lone item straight to its neighbours' mean (nothing to keep apart), a pair
    solved in place (a node beside a long edge, the common case), more items by isotonic regression."""
    steps: list[tuple] = []
    for layer in layers:
        x = 0.0
        ws = [widths[item] for item in layer]
        for item, w in zip(layer, ws):
            centre[item] = x + w / 2
            x += w + sep
        weights = [VIRTUAL_WEIGHT if item >= n_nodes else 1.0 for item in layer]
        if len(layer) == 1:
            ns = nbrs[layer[0]]
            if len(ns) == 2:
                steps.append((LONE_2, layer[0], ns[0], ns[1]))
            elif ns:
                steps.append((LONE, layer[0], ns))
        elif len(layer) == 2:
            a, b = layer
            shape = (a, b, ws[0] / 2, ws[1] / 2, weights[0], weights[1], ws[0] + sep)
            if len(nbrs[a]) == len(nbrs[b]) == 2:  # one above and one below each: a chain beside a long edge
                steps.append((PAIR_2, *shape, *nbrs[a], *nbrs[b]))
            else:
                steps.append((PAIR, *shape, nbrs[a], nbrs[b]))
        elif layer:
            steps.append((ROW, layer, ws, weights, [nbrs[item] for item in layer]))
    return steps
