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

from engine import paced, pause_point

ELLIPSIS = "…"
SEPARATORS = "/.:_"


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
        for n in paced(clashing, 64):
            _relabel(labels, used, n, middle_cut(n, width, tail))
    if width >= 3:
        for group in _clash_groups(labels, used, long):  # a window on where it differs from its look-alikes
            pause_point()
            for k, n in enumerate(group):
                near = [m for m in group[max(0, k - 1):k + 2] if m != n]
                at = max(len(os.path.commonprefix([n, m])) for m in near)
                _relabel(labels, used, n, difference_and_tail(n, at, width))
    for group in _clash_groups(labels, used, long):  # names equal in every cell the budget allows: number them
        pause_point()
        k = 1
        for n in group[1:]:
            while used[labels[n]] > 1:
                k += 1
                tag = f"~{k}"
                _relabel(labels, used, n, middle_cut(n, width - len(tag), width) + tag)
    return labels


def _clash_groups(labels: dict[str, str], used: Counter, names: list[str]) -> list[list[str]]:
    """The names sharing a label, sorted, per shared label. Compared within its group, a name's window
    lands where it differs from the names it is confused with (GPT-2 large's 36 layers differ in
    the middle, its neighbours in sorted order at the end), and numbering a group is one pass."""
    groups: dict[str, list[str]] = {}
    for n in names:
        if used[labels[n]] > 1:
            groups.setdefault(labels[n], []).append(n)
    return [sorted(g) for g in groups.values()]


def difference_and_tail(name: str, at: int, width: int) -> str:
    """ "…" + the name from just before position `at` through the next separator + "…" + its tail,
    in `width` cells: the window tells the members of a look-alike group apart (`h.4/`, `h.17/`),
    the tail the groups (`…c_proj/Constant_2`, `…attn/Constant_2`). A name too short for both
    gets one window around `at`."""
    start = max(1, at - 3)
    stop = at + 1
    while stop < len(name) and stop - start < (width - 2) // 2 and name[stop - 1] not in SEPARATORS:
        stop += 1
    tail = width - 2 - (stop - start)
    if width < 7 or stop >= len(name) - tail:
        return name_window(name, max(1, min(at - (width - 2) // 2, len(name) - (width - 1))), width)
    return ELLIPSIS + name[start:stop] + ELLIPSIS + name[len(name) - tail:]


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
