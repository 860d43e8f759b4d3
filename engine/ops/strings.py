"""String and text-feature ops. torch has no string tensors, so string ops take and return numpy
object arrays; the plan passes any value through its slots, and nothing here is differentiable.
TfIdfVectorizer counts n-grams of integer token ids."""
from __future__ import annotations

import re

import numpy as np
import torch

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register

_CASE = {"LOWER": str.lower, "UPPER": str.upper, "NONE": lambda s: s}


@describe("StringNormalizer", no_gradient="strings")
@register("StringNormalizer", since=10)
def string_normalizer(x, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=()):
    arr = np.asarray(x, dtype=object)
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[0] != 1):
        raise OnnxGradError(f"StringNormalizer needs shape [C] or [1, C], got {list(arr.shape)}")
    if case_change_action not in _CASE:
        raise UnsupportedOpError(f"StringNormalizer case_change_action {case_change_action!r} is not supported")
    words = [str(w) for w in arr.reshape(-1)]
    if is_case_sensitive:
        stops = set(stopwords)
        kept = [w for w in words if w not in stops]
    else:
        stops = {s.lower() for s in stopwords}
        kept = [w for w in words if w.lower() not in stops]
    # An input whose every word is a stopword yields one empty string, not an empty tensor.
    out = np.array([_CASE[case_change_action](w) for w in kept] or [""], dtype=object)
    return out.reshape(1, -1) if arr.ndim == 2 else out


def _texts(x):
    return np.asarray(x, dtype=object)


@describe("StringConcat", no_gradient="strings")
@register("StringConcat", since=20)
def string_concat(x, y):
    a, b = np.broadcast_arrays(_texts(x), _texts(y))
    return np.array([str(u) + str(v) for u, v in zip(a.reshape(-1), b.reshape(-1))], dtype=object).reshape(a.shape)


@describe("RegexFullMatch", no_gradient="strings")
@register("RegexFullMatch", since=20)
def regex_full_match(x, *, pattern="", device):
    # NOTE: Python's re stands in for RE2; the two agree on the common syntax (no backreferences in RE2).
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise OnnxGradError(f"RegexFullMatch: invalid pattern {pattern!r}: {exc}") from None
    arr = _texts(x)
    hits = np.array([regex.fullmatch(str(v)) is not None for v in arr.reshape(-1)], dtype=bool)
    return torch.from_numpy(hits.reshape(arr.shape)).to(device)


@describe("StringSplit", no_gradient="strings")
@register("StringSplit", since=20)
def string_split(x, *, delimiter="", maxsplit=None, device):
    arr = _texts(x)
    sep = delimiter or None  # an empty delimiter splits on runs of whitespace
    parts = [str(v).split(sep, -1 if maxsplit is None else maxsplit) for v in arr.reshape(-1)]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(arr.shape)
    width = max((len(p) for p in parts), default=0)
    out = np.array([p + [""] * (width - len(p)) for p in parts], dtype=object).reshape(*arr.shape, width)
    return out, torch.from_numpy(counts).to(device)


def _ngram_table(pool, ngram_counts, ngram_indexes, min_len, max_len):
    """{n-gram tuple: output column}: pool segment k holds the (k+1)-grams, numbered in pool order."""
    table, number = {}, 0
    bounds = list(ngram_counts) + [len(pool)]
    for size, (start, stop) in enumerate(zip(bounds, bounds[1:]), 1):
        for at in range(start, stop - size + 1, size):
            if min_len <= size <= max_len:
                table[tuple(pool[at:at + size])] = ngram_indexes[number]
            number += 1
    return table


@describe("TfIdfVectorizer", no_gradient="its input is integers or strings")
@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(x, *, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts, ngram_indexes,
                     pool_int64s=None, pool_strings=None, weights=None):
    if pool_strings or not pool_int64s:
        raise UnsupportedOpError("TfIdfVectorizer: string pools are not supported (integer token ids are)")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise UnsupportedOpError(f"TfIdfVectorizer: mode {mode!r} is not supported (use TF, IDF or TFIDF)")
    table = _ngram_table(pool_int64s, ngram_counts, ngram_indexes, min_gram_length, max_gram_length)
    width = max(ngram_indexes) + 1
    rows = x.reshape(1, -1).tolist() if x.dim() == 1 else x.tolist()
    counts = np.zeros((len(rows), width))
    for r, row in enumerate(rows):
        for skip in range(max_skip_count + 1):
            step = skip + 1
            # Unigrams do not depend on the skip distance: they are counted once, at distance 1.
            for size in range(max(min_gram_length, 1 if skip == 0 else 2), max_gram_length + 1):
                for start in range(len(row) - (size - 1) * step):
                    column = table.get(tuple(row[start:start + (size - 1) * step + 1:step]))
                    if column is not None:
                        counts[r, column] += 1
    if mode == "IDF":
        counts = (counts > 0) * (np.asarray(weights) if weights else 1.0)
    elif mode == "TFIDF" and weights:
        counts = counts * np.asarray(weights)
    out = torch.from_numpy(counts.astype(np.float32)).to(x.device)
    return out.reshape(width) if x.dim() == 1 else out
