"""Rules of one op each (engine/ops/attribute_ranges.py's BY_OP): TopK's k, Split's num_outputs, the RNNs'
hidden_size, TfIdfVectorizer's n-gram lengths and skips, MaxUnpool's strides, ConvTranspose's output_shape;
the same `rule(value, args, attributes) -> str | None` as engine/ops/attribute_rules.py."""
from __future__ import annotations

import torch

from .attribute_rules import Rule, _dim, _rank, spatial, untrimmed_output


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
    return f"in [1, {max(n, 1)}] (the split dim)" if n is not None else "at least 1"
