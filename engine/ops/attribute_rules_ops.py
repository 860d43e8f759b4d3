"""Rules of one op each (engine/ops/attribute_ranges.py's BY_OP): TopK's k, Split's num_outputs, the RNNs'
hidden_size, TfIdfVectorizer's n-gram lengths and skips, MaxUnpool's strides, ConvTranspose's output_shape;
the same `rule(value, args, attributes) -> str | None` as engine/ops/attribute_rules.py."""
from __future__ import annotations

import math

import torch
from onnx import TensorProto

from .attribute_rules import ELEMENT_TYPES, INT32_MAX, Rule, _dim, _rank, heads, kv_heads, spatial, untrimmed_output, window_fits


def topk_k(value, args, attributes):
    """TopK's k before opset 10 (an attribute then): at most the dim it picks from."""
    n = None
    r = _rank(args)
    a = attributes.get("axis", -1)
    if r is not None and -r <= a < r:
        n = _dim(args, 0, a)
    if value >= 0 and (n is None or value <= n):
        return None
    return f"in [0, {n}] (the size of the axis it picks from)" if n is not None else "at least 0"


def each_of(*allowed: int) -> Rule:
    def rule(value, args, attributes):
        return None if all(v in allowed for v in value) else f"each one of {', '.join(map(str, allowed))}"

    return rule


def unpool_strides(value, args, attributes):
    """MaxUnpool's strides: at least 1 and at most the kernel (a pool whose windows skip inputs has no inverse)."""
    kernel = attributes.get("kernel_shape") or []
    if len(kernel) == len(value) and all(1 <= s <= k for s, k in zip(value, kernel)):
        return None
    return f"each in [1, its kernel_shape entry {list(kernel)}]" if kernel else "each at least 1"


def hidden_size(gates: int) -> Rule:
    """RNN, GRU, LSTM: W holds `gates` blocks of hidden_size rows (onnxruntime checks W against the attribute)."""

    def rule(value, args, attributes):
        rows = _dim(args, 1, 1)
        if value >= 1 and (rows is None or rows == gates * value):
            return None
        return f"{rows // gates} (W's {rows} rows are {gates} gates of it)" if rows is not None and rows % gates == 0 \
            else "at least 1"

    return rule


def gram_length(value, args, attributes):
    """TfIdfVectorizer's n-gram lengths: the pool has one segment per length (ngram_counts), the op loops over them."""
    n = len(attributes.get("ngram_counts") or ())
    return None if 1 <= value <= max(n, 1) else f"in [1, {max(n, 1)}] (the pool has {n} n-gram lengths)"


def skip_count(value, args, attributes):
    """TfIdfVectorizer's max_skip_count: a skip wider than a row matches nothing, and the op loops over each."""
    n = _dim(args, 0, -1)
    if value >= 0 and (n is None or value <= n):
        return None
    return f"in [0, {n}] (the rows hold {n} tokens)" if n is not None else "at least 0"


def transpose_output_shape(value, args, attributes):
    """ConvTranspose's output_shape: at most the untrimmed output plus what an output padding below the stride adds."""
    shaped = spatial(1)(value, args, attributes)
    t, w = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if shaped is not None or not isinstance(t, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dim() != t.dim():
        return shaped
    untrimmed = untrimmed_output(t, w, attributes)
    if len(value) != t.dim() - 2 or untrimmed is None:
        return None
    strides, full = untrimmed
    most = [f + s - 1 for f, s in zip(full, strides)]  # what output_padding below the stride can add
    return None if all(v <= m for v, m in zip(value, most)) else f"each at most the untrimmed output {most}"


def num_outputs(value, args, attributes):
    """Split's num_outputs: the node's own output count where the plan says it, and at most the split dim."""
    declared = attributes.get("n_outputs")
    if declared is not None and value != declared:
        return f"{declared}, the node's output count"
    r, a = _rank(args), attributes.get("axis", 0)
    n = _dim(args, 0, a) if r is not None and isinstance(a, int) and -r <= a < r else None
    if value >= 1 and (n is None or value <= max(n, 1)):
        return None
    return f"in [1, {max(n, 1)}] (the size of axis {a}, the split dim)" if n is not None else "at least 1"


def precision(value, args, attributes):
    """QuantizeLinear's precision: 0 (y_scale's type, the spec's default) or a numeric element type to divide in."""
    if value == 0 or value in ELEMENT_TYPES and value != TensorProto.STRING:
        return None
    return "0 (y_scale's type) or a numeric ONNX element type (TensorProto.DataType: 1 to 26, not 8)"


def head_split(name: str) -> Rule:
    """Attention's and LinearAttention's q_num_heads and kv_num_heads (3-D inputs: (B, S, heads × head size)):
    each a divisor of its input's hidden size; kv_num_heads also divides q_num_heads (groups of query heads)
    and, with it, cuts query and key into heads of one size (the one they dot)."""
    own = 0 if name == "q_num_heads" else 1

    def rule(value, args, attributes):
        if value < 1:
            return "at least 1"
        hidden = _dim(args, own, 2)
        if _rank(args) != 3 or _rank(args, 1) != 3 or hidden is None:  # 4-D inputs: the heads are a dim
            return (heads() if own == 0 else kv_heads)(value, args, attributes)
        if hidden % value:
            return f"a divisor of {'query' if own == 0 else 'key'}'s hidden size {hidden}"
        q, d_q = attributes.get("q_num_heads"), _dim(args, 0, 2)
        if own == 0 or not isinstance(q, int) or q < 1 or d_q % q:
            return None
        if q % value:
            return f"a divisor of q_num_heads {q}"
        if d_q // q == hidden // value:
            return None
        return (f"a count that, with q_num_heads {q}, cuts key's {hidden} and query's {d_q} into heads of one size "
                f"(they make {hidden // value} and {d_q // q})")

    return rule


def pool_window(torch_pads: bool = False) -> Rule:
    """A pool's kernel_shape and dilations: the window fits the padded input; under SAME padding, which
    pads the input until every window fits, the padded dims stay 32-bit sizes where the pad is materialized
    (not by MaxPool's float forward without Indices and with even pads, `torch_pads`: torch's kernel)."""

    def rule(value, args, attributes):
        fits = window_fits(value, args, attributes)
        t, auto_pad = (args[0] if args else None), attributes.get("auto_pad", "NOTSET")
        if fits is not None or auto_pad not in ("SAME_UPPER", "SAME_LOWER") or not isinstance(t, torch.Tensor):
            return fits
        n = t.dim() - 2
        kernel, strides = list(attributes.get("kernel_shape") or []), list(attributes.get("strides") or [1] * n)
        dilations = list(attributes.get("dilations") or [1] * n)
        if not len(kernel) == len(strides) == len(dilations) == n or min(strides + dilations + kernel, default=1) < 1:
            return None  # their own rules say what is wrong
        sizes = [int(d) for d in t.shape[2:]]
        padded = [max(i, (-(-i // s) - 1) * s + (k - 1) * d + 1)
                  for i, k, s, d in zip(sizes, kernel, strides, dilations)]
        if max(padded, default=0) <= INT32_MAX:
            return None
        if torch_pads and t.is_floating_point() and attributes.get("n_outputs", 1) < 2 and \
                all((p - i) % 2 == 0 for p, i in zip(padded, sizes)):
            return None  # even pads: torch's kernel pads as it reads (engine/ops/pool.py's max_pool)
        return (f"a window whose {auto_pad} padding keeps the padded input within {INT32_MAX} per dim (kernel_shape "
                f"{kernel}, dilations {dilations} pad the input {sizes} to {padded})")

    return rule


def transpose_fits(value, args, attributes):
    """ConvTranspose's strides and dilations: the untrimmed output they make stays 32-bit sizes per dim
    (torch computes it whole before pads or output_shape trim it)."""
    shaped = spatial(1)(value, args, attributes)
    t, w = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if shaped is not None or not isinstance(t, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dim() != t.dim():
        return shaped
    # output_padding left out: its own rule (below the stride) bounds what it adds
    untrimmed = untrimmed_output(t, w, {**attributes, "output_padding": None})
    if untrimmed is None or max(untrimmed[1], default=0) <= INT32_MAX:
        return None
    return f"each small enough that the untrimmed output {untrimmed[1]} stays within {INT32_MAX} per dim"


def unpool_kernel(value, args, attributes):
    """MaxUnpool's kernel_shape: the output it infers, (in − 1) × stride − pads + kernel, stays 32-bit sizes."""
    shaped = spatial(1)(value, args, attributes)
    t = args[0] if args else None
    if shaped is not None or not isinstance(t, torch.Tensor) or len(value) != t.dim() - 2:
        return shaped
    n = len(value)
    strides, pads = list(attributes.get("strides") or [1] * n), list(attributes.get("pads") or [0] * (2 * n))
    if len(strides) != n or len(pads) != 2 * n:
        return None
    inferred = [(int(d) - 1) * s - (pads[i] + pads[n + i]) + k
                for i, (d, s, k) in enumerate(zip(t.shape[2:], strides, value))]
    if max(inferred, default=0) <= INT32_MAX:
        return None
    return f"each small enough that the inferred output {inferred} stays within {INT32_MAX} per dim"


def roi_sampling(value, args, attributes):
    """RoiAlign's sampling_ratio: each RoI's grid of samples, C × (output_height · r) × (output_width · r),
    is materialized: it holds at most 2^31 − 1 elements."""
    if value < 0:
        return "at least 0 (0: adaptive)"
    c = _dim(args, 0, 1)
    h, w = attributes.get("output_height", 1), attributes.get("output_width", 1)
    if c is None or not isinstance(h, int) or not isinstance(w, int) or c * h * w * value * value <= INT32_MAX:
        return None
    most = math.isqrt(INT32_MAX // max(1, c * h * w))
    return (f"in [0, {most}] (each RoI's sample grid, {c} channels × {h}·r × {w}·r, holds at most {INT32_MAX} "
            "elements)")
