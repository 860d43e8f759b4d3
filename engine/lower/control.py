"""Backward rules of engine/ops/control.py: Scan unrolled over its static sequence length (each
iteration a copy of the body, differentiated in turn); Loop refused (its trip count and condition are
run-time values)."""
from __future__ import annotations

import numpy as np

from .context import attr
from .decompose import inline_graph, through
from .registry import refuse, rule

refuse("a Loop's trip count and condition are run-time values, so it cannot be unrolled", "Loop")
refuse("If branches are not lowered (a condition known while lowering is not folded either)", "If")


@rule("Scan")
def scan(ctx, node, grads):
    return through(ctx, node, grads, lambda: _unrolled(ctx, node))


def _unrolled(ctx, node) -> list[str]:
    body = attr(node, "body")
    m = attr(node, "num_scan_inputs")
    n_state = len(node.input) - m
    n_scan_out = len(body.output) - n_state
    scans = list(node.input[n_state:])
    in_axes = list(attr(node, "scan_input_axes") or [0] * m)
    in_dirs = list(attr(node, "scan_input_directions") or [0] * m)
    out_axes = list(attr(node, "scan_output_axes") or [0] * n_scan_out)
    out_dirs = list(attr(node, "scan_output_directions") or [0] * n_scan_out)
    ranks = [ctx.need_rank(s) for s in scans]
    in_axes = [a % r for a, r in zip(in_axes, ranks)]
    info = ctx.types.get(scans[0])
    steps = None if info is None or info.shape is None else info.shape[in_axes[0]]
    if steps is None:
        raise ctx.error(f"needs the static length of the scanned axis of {scans[0]!r}")
    states = list(node.input[:n_state])
    outs: list[list[str]] = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        slices = [ctx.op("Gather", [s, ctx.const(np.asarray(steps - 1 - t if d else t, np.int64))], axis=a)
                  for s, a, d in zip(scans, in_axes, in_dirs)]
        results = inline_graph(ctx, body, states + slices, f"{node.name or 'Scan'}/{t}")
        states = results[:n_state]
        for k, v in enumerate(results[n_state:]):
            outs[k].append(v)
    stacked = []
    for k, values in enumerate(outs):
        if out_dirs[k]:
            values = values[::-1]
        axis = out_axes[k]
        if axis < 0:  # the per-iteration value's rank plus the new axis
            axis += len(body.output[n_state + k].type.tensor_type.shape.dim) + 1
        stacked.append(ctx.op("Concat", [ctx.op("Unsqueeze", [v, ctx.ints([axis])]) for v in values], axis=axis))
    return states + stacked
