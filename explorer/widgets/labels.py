"""Names cut to a column budget without making two of them look the same.

Model names share long prefixes (`gpu_0/res2_0_branch1_bn_s`, `..._bn_b`, `..._bn_rm`): cutting
the end off makes them identical. A cut name keeps its head and its tail around a middle "…";
names whose labels would still collide keep more of the tail, then a window around the first
character where they differ from their nearest look-alike, and as a last resort a counter.
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Iterable

ELLIPSIS = "…"


def middle_cut(name: str, width: int, tail: int) -> str:
    """`name` in at most `width` cells: head + "…" + the last `tail` characters."""
    if len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[:width]
    tail = max(0, min(tail, width - 1))
    return name[:width - 1 - tail] + ELLIPSIS + name[len(name) - tail:]


def fit_labels(names: Iterable[str], width: int) -> dict[str, str]:
    """A label of at most `width` cells per distinct name; distinct names get distinct labels
    whenever `width` allows (at least 3 cells)."""
    distinct = list(dict.fromkeys(names))
    labels = {n: middle_cut(n, width, (width - 1) // 2) for n in distinct}
    used = Counter(labels.values())
    long = [n for n in distinct if len(n) > width]
    for tail in range((width - 1) // 2 + 1, width):  # clashes keep more of their tail
        clashing = [n for n in long if used[labels[n]] > 1]
        if not clashing:
            return labels
        for n in clashing:
            _relabel(labels, used, n, middle_cut(n, width, tail))
    clashing = [n for n in long if used[labels[n]] > 1]
    if clashing and width >= 3:
        ordered = sorted(clashing)
        for k, n in enumerate(ordered):  # a window on where it differs from its neighbours
            near = [m for m in ordered[max(0, k - 1):k + 2] if m != n]
            if not near:
                continue
            at = max(len(os.path.commonprefix([n, m])) for m in near)
            start = max(1, min(at - (width - 2) // 2, len(n) - (width - 1)))
            window = name_window(n, start, width)
            _relabel(labels, used, n, window)
    for n in long:  # names equal in every cell the budget allows: number them
        k = 1
        while used[labels[n]] > 1:
            k += 1
            tag = f"~{k}"
            _relabel(labels, used, n, middle_cut(n, width - len(tag), width) + tag)
    return labels


def name_window(name: str, start: int, width: int) -> str:
    """ "…" + name[start:...] (+ "…" when the name goes on) in `width` cells."""
    body = name[start:start + width - 1]
    if start + len(body) < len(name):
        body = body[:-1] + ELLIPSIS
    return ELLIPSIS + body


def _relabel(labels: dict[str, str], used: Counter, name: str, label: str) -> None:
    used[labels[name]] -= 1
    labels[name] = label
    used[label] += 1
