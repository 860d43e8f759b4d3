"""Compare a backend's outputs with a case's expected outputs, as onnx's own runner does.

Same rules as `onnx.backend.test.runner.Runner.assert_similar_outputs`: equal shapes and element
types, `allclose(rtol, atol)` for floats (NaN equal to NaN), exact equality otherwise, bfloat16
allowed two ulps. The result is '' when equal, else one line saying where and by how much.
"""
from __future__ import annotations

import numpy as np


def _dtype_name(arr: np.ndarray) -> str:
    return str(arr.dtype)


def compare(got, want, rtol: float, atol: float, *, check_dtype: bool = True, values: bool = True) -> str:
    if want is None or got is None:
        return "" if got is None and want is None else f"{'empty' if got is None else 'a value'} where " \
            f"{'an empty optional' if want is None else 'a value'} was expected"
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"a tensor where a sequence of {len(want)} was expected"
        if len(got) != len(want):
            return f"sequence length {len(got)} != expected {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            problem = compare(g, w, rtol, atol, check_dtype=check_dtype, values=values)
            if problem:
                return f"[{k}] {problem}"
        return ""
    if isinstance(got, (list, tuple)):
        return f"a sequence of {len(got)} where a tensor was expected"
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != expected {want.shape}"
    if want.dtype == object or want.dtype.kind in "SU":
        return "" if np.array_equal(got, want) else "string values differ"
    if check_dtype and got.dtype != want.dtype:
        return f"element type {_dtype_name(got)} != expected {_dtype_name(want)}"
    if not values:
        return ""
    if want.dtype.name == "bfloat16":
        rtol = max(rtol, 2.0**-6)
    if want.dtype.kind == "b":
        ok = got.astype(bool) == want
    elif want.dtype.kind in "iu":
        ok = got.astype(np.int64) == want.astype(np.int64) if want.dtype != np.uint64 else got == want
    else:
        g, w = _as_float(got), _as_float(want)
        ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        # isclose treats +inf == +inf; a NaN against a number is already False.
    if ok.all():
        return ""
    return _describe(got, want, ok)


def _as_float(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind in "fiub":
        return arr.astype(np.float64)
    return arr.astype(np.float32).astype(np.float64)  # ml_dtypes (bfloat16, float8...)


def _describe(got: np.ndarray, want: np.ndarray, ok: np.ndarray) -> str:
    bad = int((~ok).sum())
    idx = np.unravel_index(int(np.argmax(~ok.reshape(-1))), ok.shape) if ok.ndim else ()
    at = tuple(int(k) for k in idx)
    g, w = got[idx], want[idx]
    if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
        gf, wf = _as_float(got), _as_float(want)
        with np.errstate(invalid="ignore"):
            diff = np.abs(gf - wf)
        finite = diff[np.isfinite(diff)]
        worst = f"max |diff| {finite.max():.3g}, " if finite.size else ""
        return f"{bad}/{ok.size} values differ ({worst}first at {at}: {float(g):.6g} vs expected {float(w):.6g})"
    return f"{bad}/{ok.size} values differ (first at {at}: {g} vs expected {w})"
