"""Backward rule of LSTM: unroll the recurrence into MatMul / Sigmoid / Tanh steps, differentiate those.

The time axis must be static. Covered: forward or reverse direction, layout 0, the default
activations, peepholes; not covered (one-line error): bidirectional, sequence_lens, clip,
input_forget, custom activations, layout 1.
"""
from __future__ import annotations

from .context import attr
from .core import propagate
from .registry import rule


def _unsupported(ctx, node) -> str | None:
    inputs = list(node.input) + [""] * (8 - len(node.input))
    if attr(node, "direction", "forward") not in ("forward", "reverse"):
        return "bidirectional LSTM"
    if inputs[4]:
        return "sequence_lens"
    if attr(node, "clip") is not None or attr(node, "input_forget", 0) or attr(node, "layout", 0):
        return "clip, input_forget or layout=1"
    acts = attr(node, "activations")
    if acts and [a for a in acts] != ["Sigmoid", "Tanh", "Tanh"]:
        return "custom activations"
    return None


def unrolled(ctx, node) -> dict[str, str]:
    """Nodes recomputing the LSTM's outputs from its inputs; forward output name -> recomputed name."""
    x, w, r, b, _, h0, c0, p = list(node.input) + [""] * (8 - len(node.input))
    steps, batch, _ = ctx.need_shape(x)
    hidden = attr(node, "hidden_size") or ctx.need_shape(r)[-1]
    squeeze0 = ctx.ints([0])

    def first(t):
        return ctx.op("Squeeze", [t, squeeze0])

    w_t, r_t = ctx.op("Transpose", [first(w)]), ctx.op("Transpose", [first(r)])
    bias = None
    if b:
        wb, rb = ctx.op("Split", [first(b), ctx.ints([4 * hidden, 4 * hidden])], n=2, axis=0)
        bias = ctx.op("Add", [wb, rb])
    zeros = ctx.op("ConstantOfShape", [ctx.ints([batch, hidden])])
    h = first(h0) if h0 else ctx.op("Cast", [zeros], to=ctx.elem(x))
    c = first(c0) if c0 else ctx.op("Cast", [zeros], to=ctx.elem(x))
    peep = ctx.op("Split", [first(p), ctx.ints([hidden] * 3)], n=3, axis=0) if p else None
    order = range(steps) if attr(node, "direction", "forward") == "forward" else reversed(range(steps))
    hs = {}
    for t in order:
        xt = first(ctx.op("Slice", [x, ctx.ints([t]), ctx.ints([t + 1]), squeeze0]))
        gates = ctx.op("Add", [ctx.op("MatMul", [xt, w_t]), ctx.op("MatMul", [h, r_t])])
        if bias:
            gates = ctx.op("Add", [gates, bias])
        i, o, f, cand = ctx.op("Split", [gates, ctx.ints([hidden] * 4)], n=4, axis=1)
        if peep:
            i = ctx.op("Add", [i, ctx.op("Mul", [peep[0], c])])
            f = ctx.op("Add", [f, ctx.op("Mul", [peep[2], c])])
        i, f = ctx.op("Sigmoid", [i]), ctx.op("Sigmoid", [f])
        c = ctx.op("Add", [ctx.op("Mul", [f, c]), ctx.op("Mul", [i, ctx.op("Tanh", [cand])])])
        if peep:
            o = ctx.op("Add", [o, ctx.op("Mul", [peep[1], c])])
        h = ctx.op("Mul", [ctx.op("Sigmoid", [o]), ctx.op("Tanh", [c])])
        hs[t] = h
    seq = ctx.op("Concat", [ctx.op("Unsqueeze", [hs[t], ctx.ints([0, 1])]) for t in range(steps)], axis=0)
    names = [seq, ctx.op("Unsqueeze", [h, squeeze0]), ctx.op("Unsqueeze", [c, squeeze0])]
    return {out: new for out, new in zip(node.output, names) if out}


@rule("LSTM")
def lstm(ctx, node, grads):
    why = _unsupported(ctx, node)
    if why:
        raise ctx.error(f"{why} is not lowered")
    start = len(ctx.nodes)
    recomputed = unrolled(ctx, node)
    decomposition = ctx.nodes[start:]
    ctx.infer(decomposition, [t for t in node.input if t])
    seeds = {recomputed[out]: g for out, g in zip(node.output, grads) if out and g is not None}
    wanted = [t if ctx.wants(i) else "" for i, t in enumerate(node.input)]
    targets = [t for t in wanted if t]
    found = dict(zip(targets, propagate(ctx, decomposition, seeds, targets)))
    return [found.get(t) if t else None for t in wanted]
