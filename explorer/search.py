"""Ranking for the list's search: exact name, then prefix, then substring, then fuzzy.

Tiers first, scores only inside a tier: a long fuzzy run (`ConstantOfShape_10` for the query
`ConstantOfShape_0`) must never outrank the name the user typed out in full.
"""
from __future__ import annotations

import bisect
import itertools
import re
from typing import Protocol, Sequence, TypeVar

MAX_HITS = 300

EXACT, EXACT_ANY_CASE, PREFIX, SUBSTRING, DETAIL, FUZZY = range(6)


class Named(Protocol):
    name: str
    detail: str


E = TypeVar("E", bound=Named)


def fuzzy_score(query: str, text: str) -> float:
    """0 when `query` is not a subsequence of `text` (case-insensitive); more for runs and word starts."""
    q, t = query.lower(), text.lower()
    if not q:
        return 1.0
    score, pos, run = 0.0, 0, 0
    for ch in q:
        found = t.find(ch, pos)
        if found < 0:
            return 0.0
        run = run + 1 if found == pos else 0
        score += 1.0 + run * 2.0 + (3.0 if found == 0 or not t[found - 1].isalnum() else 0.0)
        pos = found + 1
    return score - len(t) * 0.05


def rank(query: str, name: str, detail: str = "") -> tuple[int, float] | None:
    """(tier, -score) to sort by, or None when the entry does not match at all."""
    q = query.strip()
    low, lname = q.lower(), name.lower()
    if name == q:
        return EXACT, 0.0
    if lname == low:
        return EXACT_ANY_CASE, 0.0
    if lname.startswith(low):
        return PREFIX, float(len(name))  # the shortest completion first
    where = lname.find(low)
    if where >= 0:
        return SUBSTRING, where + len(name) / 1000
    if low in detail.lower():  # "conv" finds every Conv node, "[1,64" a shape
        return DETAIL, float(len(name))
    score = fuzzy_score(q, name)
    return (FUZZY, -score) if score > 0 else None


class SearchIndex:
    """The entries of one graph, lowercased into one string per field, built once and searched per
    keystroke: every tier is a regex over that string (C speed), Python only touches the hits."""

    def __init__(self, entries: Sequence[E]):
        self.entries = list(entries)
        self._names = _Lines([e.name.lower() for e in self.entries])
        self._details = _Lines([e.detail.lower() for e in self.entries])

    def search(self, query: str, limit: int = MAX_HITS) -> list[E]:
        """The entries matching `query`, best first; ties keep the list's order. Empty query: all."""
        q = query.strip()
        if not q:
            return list(self.entries)
        low = q.lower()
        entries = self.entries
        ranked = {k: rank(q, entries[k].name) for k in self._names.containing(low)}
        # The slower tiers only when the faster ones leave room: an exact name never pays for them.
        if len(ranked) < limit:
            for k in self._details.containing(low):
                ranked.setdefault(k, (DETAIL, float(len(entries[k].name))))
        if len(ranked) < limit:
            # `[^c\n]*+c` takes the first c of the line and never backtracks, which is enough:
            # matching each letter at its leftmost place finds a subsequence whenever there is one.
            subsequence = "^" + "".join(f"[^{re.escape(c)}\\n]*+{re.escape(c)}" for c in low)
            for k in self._names.matching(subsequence):
                if k not in ranked:
                    ranked[k] = (FUZZY, -fuzzy_score(low, self._names.lines[k]))
        best = sorted((r, k) for k, r in ranked.items())[:limit]
        return [entries[k] for _, k in best]


class _Lines:
    """Strings joined by newlines, and which of them a regex matches."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.blob = "\n".join(lines)
        self.starts = list(itertools.accumulate((len(t) + 1 for t in lines[:-1]), initial=0))

    def containing(self, text: str) -> list[int]:
        return [k for k, line in enumerate(self.lines) if text in line]

    def matching(self, pattern: str) -> list[int]:
        found = (bisect.bisect_right(self.starts, m.start()) - 1
                 for m in re.finditer(pattern, self.blob, re.MULTILINE))
        return list(dict.fromkeys(found))


def search(entries: Sequence[E], query: str, limit: int = MAX_HITS) -> list[E]:
    """One-off search (tests, small lists); the list widget keeps a SearchIndex."""
    return SearchIndex(entries).search(query, limit)
