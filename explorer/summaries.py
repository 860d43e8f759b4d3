"""A tensor's statistics and histogram, computed in bounded memory, once per array. No Textual.

The inspector summarizes the tensor under the cursor only. A small array is summarized as it is
drawn; a big one in a worker, a chunk at a time: GPT-2's token embedding (38.6 M elements) took
10 s of the UI thread in one float64 pass (a 300 MB copy) on a loaded machine, for every redraw
of the inspector. Summaries are cached by array identity, so a redraw never recomputes one.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine import pause_point

INLINE_ELEMENTS = 1 << 18  # up to this many elements (a 512×512 matrix, ~5 ms) the inspector summarizes inline
# 0.5 MB of float64 at a time: the memory a summary of any size needs. numpy's indexing and bincount
# hold the interpreter lock for a whole piece: pieces of 1 << 20 held it 20-28 ms each (a key waited),
# these ~1 ms; and the token embedding's summary takes 0.5 s instead of 1.1 s (the pieces fit the cache).
CHUNK_ELEMENTS = 1 << 16
BINS = 24


@dataclass(frozen=True)
class Summary:
    """norm, mean, min, max and the histogram are over the finite elements (None when there are none)."""

    shape: tuple[int, ...]
    dtype: str
    nonfinite: int = 0
    norm: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    max_abs: float | None = None
    counts: tuple[int, ...] = ()  # BINS bins over [min, max]; empty when min == max or nothing is finite
    finite: int = 0

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def as_dict(self) -> dict:
        """The JSON-ready form reports and tables use (numeric keys only where the dtype is numeric)."""
        out: dict = {"shape": list(self.shape), "dtype": self.dtype}
        if self.size == 0 or np.dtype(self.dtype).kind not in "fiub":
            return out
        out["nonfinite"] = self.nonfinite
        if self.finite:
            out.update(norm=self.norm, min=self.min, max=self.max, mean=self.mean, max_abs=self.max_abs)
        return out


def chunks(a: np.ndarray):
    """The elements of `a` as 1-D pieces of about CHUNK_ELEMENTS, copying at most one piece at a time."""
    if a.ndim == 0:
        yield a.reshape(1)
        return
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        for k in range(0, flat.size, CHUNK_ELEMENTS):
            yield flat[k:k + CHUNK_ELEMENTS]
        return
    row = max(1, a[0].size)
    step = max(1, CHUNK_ELEMENTS // row)
    for k in range(0, a.shape[0], step):
        yield np.ascontiguousarray(a[k:k + step]).reshape(-1)


def summarize(a, should_stop: Callable[[], bool] | None = None) -> Summary | None:
    """The summary of `a` (anything np.asarray takes); None when `should_stop` said so between chunks."""
    a = np.asarray(a)
    shape, dtype = tuple(int(d) for d in a.shape), str(a.dtype)
    if a.size == 0 or a.dtype.kind not in "fiub":
        return Summary(shape, dtype)
    finite = nonfinite = 0
    total = squares = 0.0
    lo, hi = math.inf, -math.inf
    for piece in chunks(a):
        pause_point()
        if should_stop is not None and should_stop():
            return None
        f = piece.astype(np.float64)
        ok = np.isfinite(f)
        if not ok.all():
            nonfinite += int(f.size - ok.sum())
            f = f[ok]
        if f.size:
            finite += f.size
            total += float(f.sum())
            squares += float(np.dot(f, f))
            lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
    if not finite:
        return Summary(shape, dtype, nonfinite)
    counts = np.zeros(BINS, dtype=np.int64)
    if lo < hi:
        edges = np.linspace(lo, hi, BINS + 1)
        for piece in chunks(a):
            pause_point()
            if should_stop is not None and should_stop():
                return None
            f = piece.astype(np.float64)
            counts += bin_counts(f[np.isfinite(f)], edges)
    return Summary(shape, dtype, nonfinite, math.sqrt(squares), total / finite, lo, hi, max(-lo, hi),
                   tuple(int(c) for c in counts) if lo < hi else (), finite)


def bin_counts(f: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """np.histogram(f, bins=edges) for equal bins holding every element of f, as numpy computes it
    (the same corrections at the edges) but in a few whole-array operations: np.histogram's own
    Python loop over blocks of 65,536 held the interpreter lock the UI thread waits for."""
    n = len(edges) - 1
    index = ((f - edges[0]) * (n / (edges[-1] - edges[0]))).astype(np.intp)
    np.minimum(index, n - 1, out=index)
    index[f < edges[index]] -= 1
    index[(f >= edges[index + 1]) & (index != n - 1)] += 1
    return np.bincount(index, minlength=n)


def array_stats(a) -> dict:
    """shape, dtype, norm, min, max, mean, max_abs and the non-finite count of an array (JSON-ready)."""
    return summarize(a).as_dict()


class SummaryCache:
    """Summaries by (kind, tensor name), valid while the array they were made from is the one shown.

    Holds weak references: a value or gradient replaced (new feeds, dtype, run) drops its summary
    with it, and the cache never keeps an array alive."""

    def __init__(self):
        self._entries: dict[tuple[str, str], tuple[weakref.ref, Summary]] = {}

    def get(self, kind: str, name: str, array) -> Summary | None:
        hit = self._entries.get((kind, name))
        return hit[1] if hit is not None and hit[0]() is array else None

    def put(self, kind: str, name: str, array, summary: Summary) -> None:
        try:
            ref = weakref.ref(array)
        except TypeError:  # a plain Python value: nothing to key on, and cheap to summarize again
            return
        self._entries[(kind, name)] = (ref, summary)
        if len(self._entries) > 4096:  # dead entries of long sessions
            self._entries = {k: v for k, v in self._entries.items() if v[0]() is not None}

    def summary(self, kind: str, name: str, array) -> Summary | None:
        """The cached summary, else one made now when the array is small; None: ask a worker."""
        hit = self.get(kind, name, array)
        if hit is None and np.size(array) <= INLINE_ELEMENTS:
            hit = summarize(array)
            self.put(kind, name, array, hit)
        return hit
