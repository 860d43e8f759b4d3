"""Backward rules of engine/ops/control.py. If: an If on the same condition whose branches are the
branches' backward graphs. Loop: the loop run again recording each iteration's carried values, then a
second Loop running the body's backward from the last iteration to the first (the trip count and the
condition may be run-time values). Scan: unrolled over its static sequence length. Gradients also reach
the tensors a body reads from the enclosing graph (weights), summed over iterations."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..modelfile.index import node_inputs
from .context import TypeInfo, attr
from .core import propagate
from .decompose import inline_graph, through
from .registry import rule


def _outer_targets(ctx, node) -> list[str]:
    """The tensors the node's subgraphs read from this graph whose gradients are wanted."""
    inputs = node_inputs(node)
    return [t for i, t in enumerate(inputs) if i >= len(node.input) and ctx.wants(i)]


def _returned(node, wanted: dict[str, str]) -> list:
    return [wanted.get(t) for t in node_inputs(node)]


@rule("If")
def if_(ctx, node, grads):
    """Each branch's backward graph (zeros for a tensor the branch does not read), chosen by the same condition."""
    targets = _outer_targets(ctx, node)
    if not targets:
        return _returned(node, {})
    label = node.name or "If"
    outs = [ctx.fresh(f"{label}/d{t}") for t in targets]
    branches = {}
    for key in ("then_branch", "else_branch"):
        sub = ctx.sub(f"{ctx.prefix}/{label}/{key}")
        results = inline_graph(sub, attr(node, key), [], key)
        forward = list(sub.nodes)
        sub.infer(forward, [])
        found = propagate(sub, forward, {r: g for r, g in zip(results, grads) if g is not None}, targets)
        for t, f, o in zip(targets, found, outs):
            sub.emit("Identity", [f if f is not None else sub.fill_like(t, 0.0)], [o])
        # outputs typed without shapes: a branch the condition never takes may see dy at another rank (an
        # exporter's If that squeezes an axis only where it is 1), which a declared shape would refuse
        branches[key] = helper.make_graph(sub.nodes, f"{label}_{key}_backward", [],
                                          [helper.make_tensor_value_info(o, ctx.elem(t), None) for o, t in zip(outs, targets)])
    ctx.emit("If", [node.input[0]], outs, **branches)
    return _returned(node, dict(zip(targets, outs)))


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


FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _typed(ctx, name: str, elem: int, shape=None) -> str:
    ctx.types[name] = TypeInfo(elem, shape)
    return name


def _like(ctx, name: str, like: str) -> str:
    ctx.types[name] = ctx.types.get(like, TypeInfo(ctx.elem(like), None))
    return name


def _recording(ctx, node, body, label: str) -> tuple[str, list[str]]:
    """The loop run again, each iteration also emitting its number and carried inputs as scan outputs:
    (how many iterations ran, each carried value stacked over the iterations)."""
    rec = ctx.sub(f"{ctx.prefix}/{label}/record")
    names = [_typed(rec, rec.fresh("iteration"), TensorProto.INT64, ()),
             _typed(rec, rec.fresh("condition"), TensorProto.BOOL, ())]
    names += [_like(rec, rec.fresh("carried"), v) for v in node.input[2:]]
    results = inline_graph(rec, body, names, "record")
    extra = [rec.op("Identity", [t]) for t in [names[0]] + names[2:]]
    graph = helper.make_graph(rec.nodes, f"{label}_record", [rec.value_info(n, n) for n in names],
                              [helper.make_tensor_value_info(r, 0, None) for r in results + extra])
    recorded = ctx.op("Loop", list(node.input), n=len(results) - 1 + len(extra), body=graph)
    iterations, values = recorded[len(results) - 1], recorded[len(results):]
    return ctx.op("Squeeze", [ctx.op("Shape", [iterations]), ctx.ints([0])]), values


def _backward_body(ctx, node, body, grads, values, count, floats, targets, label: str):
    """The body of the backward Loop: step i differentiates iteration count-1-i, recomputed from its
    recorded carried inputs; it carries the carried values' gradients and sums the outer ones."""
    carried = list(node.input[2:])
    bwd = ctx.sub(f"{ctx.prefix}/{label}/backward")
    step, cond_in = bwd.fresh("step"), bwd.fresh("condition")
    g_in = [bwd.fresh(f"d{carried[k]}") for k in floats]
    acc_in = [bwd.fresh(f"d{t}") for t in targets]
    last = bwd.op("Sub", [count, bwd.const(np.asarray(1, np.int64))])
    at = _typed(bwd, bwd.op("Sub", [last, step]), TensorProto.INT64, ())
    now = [_like(bwd, bwd.op("Gather", [values[k], at], axis=0), v) for k, v in enumerate(carried)]
    start = len(bwd.nodes)
    outs = inline_graph(bwd, body, [at, bwd.const(np.asarray(True)), *now], "recompute")
    forward = bwd.nodes[start:]
    bwd.infer(forward, [at, *now])
    seeds = {outs[1 + k]: g for k, g in zip(floats, g_in)}
    for j, g in enumerate(grads[len(carried):]):
        if g is not None:  # a scan output's gradient: its slice of this iteration
            seeds[outs[1 + len(carried) + j]] = bwd.op("Gather", [g, at], axis=0)
    found = propagate(bwd, forward, seeds, [now[k] for k in floats] + targets)
    new_g = [f if f is not None else bwd.fill_like(now[k], 0.0) for k, f in zip(floats, found)]
    new_acc = [a if f is None else bwd.op("Add", [a, f]) for a, f in zip(acc_in, found[len(floats):])]
    keep = bwd.op("Identity", [bwd.const(np.asarray(True))])
    scalar_in = [helper.make_tensor_value_info(step, TensorProto.INT64, []),
                 helper.make_tensor_value_info(cond_in, TensorProto.BOOL, [])]
    state_in = [ctx.value_info(n, carried[k]) for n, k in zip(g_in, floats)]
    state_in += [ctx.value_info(n, x) for n, x in zip(acc_in, targets)]
    state_out = [ctx.value_info(n, carried[k]) for n, k in zip(new_g, floats)]
    state_out += [ctx.value_info(n, x) for n, x in zip(new_acc, targets)]
    return helper.make_graph(bwd.nodes, f"{label}_backward", scalar_in + state_in,
                             [helper.make_tensor_value_info(keep, TensorProto.BOOL, [])] + state_out)


@rule("Loop")
def loop(ctx, node, grads):
    body = attr(node, "body")
    label = node.name or "Loop"
    carried = list(node.input[2:])
    floats = [k for k, v in enumerate(carried) if ctx.elem(v) in FLOATS]
    targets = _outer_targets(ctx, node)
    count, values = _recording(ctx, node, body, label)
    graph = _backward_body(ctx, node, body, grads, values, count, floats, targets, label)
    start = [grads[k] if grads[k] is not None else ctx.fill_like(carried[k], 0.0) for k in floats]
    done = ctx.op("Loop", [count, "", *start, *[ctx.fill_like(t, 0.0) for t in targets]],
                  n=len(floats) + len(targets), body=graph)
    done = done if isinstance(done, list) else [done]
    wanted = dict(zip([carried[k] for k in floats] + targets, done))
    return [None, None] + [wanted.get(v) if ctx.wants(2 + k) else None for k, v in enumerate(carried)] + \
        [wanted.get(t) for t in node_inputs(node)[len(node.input):]]
