"""String ops. torch has no string tensors, so these take and return numpy object arrays;
the plan passes any value through its slots, and nothing here is differentiable."""
from __future__ import annotations

import numpy as np

from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import register

_CASE = {"LOWER": str.lower, "UPPER": str.upper, "NONE": lambda s: s}


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
