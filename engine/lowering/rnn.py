"""Backward rules of RNN, GRU and LSTM: the recurrence unrolled into MatMul / activation / Where steps
exactly as engine/ops/rnn.py computes it, then differentiated (the time axis must be static).

Covered: every direction (bidirectional too), layout 0 and 1, sequence_lens (a state freezes and Y is 0
past a sequence's end; the reverse direction reverses each sequence's valid prefix), clip, the ONNX
activation functions with their alpha / beta, LSTM's peepholes and input_forget, GRU's
linear_before_reset.
"""
from __future__ import annotations

import numpy as np

from .context import attr
from .decompose import through
from .registry import rule

DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _affine(ctx, x, a, b, like):
    return ctx.op("Add", [ctx.op("Mul", [x, ctx.scalar(a, like)]), ctx.scalar(b, like)])


# name -> (builder(ctx, x, alpha, beta, like), default alpha, default beta), as the engine's _ACTIVATIONS;
# `like` is the node's X, whose element type the scalars take (the unrolled tensors are not typed yet)
ACTIVATIONS = {
    "relu": (lambda ctx, x, a, b, like: ctx.op("Relu", [x]), None, None),
    "tanh": (lambda ctx, x, a, b, like: ctx.op("Tanh", [x]), None, None),
    "sigmoid": (lambda ctx, x, a, b, like: ctx.op("Sigmoid", [x]), None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (lambda ctx, x, a, b, like: ctx.op("LeakyRelu", [x], alpha=a), 0.01, None),
    "thresholdedrelu": (lambda ctx, x, a, b, like: ctx.op("ThresholdedRelu", [x], alpha=a), 1.0, None),
    "scaledtanh": (lambda ctx, x, a, b, like: ctx.op("Mul", [ctx.op("Tanh", [ctx.op("Mul", [x, ctx.scalar(b, like)])]),
                                                       ctx.scalar(a, like)]), 1.0, 1.0),
    "hardsigmoid": (lambda ctx, x, a, b, like: ctx.op("HardSigmoid", [x], alpha=a, beta=b), 0.2, 0.5),
    "elu": (lambda ctx, x, a, b, like: ctx.op("Elu", [x], alpha=a), 1.0, None),
    "softsign": (lambda ctx, x, a, b, like: ctx.op("Softsign", [x]), None, None),
    "softplus": (lambda ctx, x, a, b, like: ctx.op("Softplus", [x]), None, None),
}


def _activations(ctx, node, dirs: int, like: str):
    """Each direction's activation functions, alpha / beta consumed in order as the engine does."""
    defaults = DEFAULTS[node.op_type]
    names = list(attr(node, "activations") or defaults * dirs)
    alphas, betas = list(attr(node, "activation_alpha") or []), list(attr(node, "activation_beta") or [])
    bound = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise ctx.error(f"activation {name!r} is not lowered")
        fn, da, db = ACTIVATIONS[name.lower()]
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        bound.append(lambda x, fn=fn, a=a, b=b: fn(ctx, x, a, b, like))
    k = len(defaults)
    return [bound[d * k:(d + 1) * k] for d in range(dirs)]


def _scalar_index(ctx, k: int) -> str:
    return ctx.const(np.asarray(k, np.int64))


def _pick(ctx, t: str, k: int) -> str:
    """t[k] along axis 0 (the axis dropped)."""
    return ctx.op("Gather", [t, _scalar_index(ctx, k)], axis=0)


def _stack(ctx, parts, axis: int) -> str:
    return ctx.op("Concat", [ctx.op("Unsqueeze", [p, ctx.ints([axis])]) for p in parts], axis=axis)


class Unrolled:
    """The nodes recomputing one RNN / GRU / LSTM node's outputs from its inputs."""

    def __init__(self, ctx, node):
        self.ctx, self.node, self.op = ctx, node, node.op_type
        inputs = list(node.input) + [""] * (8 - len(node.input))
        self.x, self.w, self.r, self.b, lens, self.h0 = inputs[:6]
        self.c0, self.p = (inputs[6], inputs[7]) if self.op == "LSTM" else ("", "")
        self.layout = attr(node, "layout", 0)
        direction = attr(node, "direction", "forward")
        self.names = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        self.hidden = attr(node, "hidden_size") or ctx.need_shape(self.r)[-1]
        self.acts = _activations(ctx, node, len(self.names), self.x)
        clip = attr(node, "clip")
        self.clip = (lambda v: v) if clip is None else (
            lambda v: ctx.op("Clip", [v, ctx.scalar(-clip, self.x), ctx.scalar(clip, self.x)]))
        self.lens = ctx.op("Cast", [lens], to=7) if lens else ""

    def outputs(self) -> list[str]:
        ctx = self.ctx
        x = ctx.op("Transpose", [self.x], perm=[1, 0, 2]) if self.layout else self.x
        info = ctx.types.get(self.x)
        steps = None if info is None or info.shape is None else info.shape[self.layout]
        if steps is None:
            raise ctx.error(f"needs the static length of the time axis of {self.x!r}")
        batch = ctx.dims(self.x, 1 - self.layout, 2 - self.layout)
        states = [self._initial(s, batch) for s in ([self.h0, self.c0] if self.op == "LSTM" else [self.h0])]
        ys, finals = [], []
        for d, name in enumerate(self.names):
            xd = x
            if name == "reverse" and self.lens:
                xd = ctx.op("ReverseSequence", [x, self.lens], batch_axis=1, time_axis=0)
            order = range(steps) if name == "forward" or self.lens else range(steps - 1, -1, -1)
            st = [_pick(ctx, s, d) for s in states]
            outs = {}
            for t in order:
                new = self._step(d, _pick(ctx, xd, t), st)
                if self.lens:  # past a sequence's length the state freezes and Y is 0
                    valid = ctx.op("Unsqueeze", [ctx.op("Less", [_scalar_index(ctx, t), self.lens]), ctx.ints([1])])
                    new = [ctx.op("Where", [valid, n, o]) for n, o in zip(new, st)]
                    outs[t] = ctx.op("Where", [valid, new[0], ctx.scalar(0.0, self.x)])
                else:
                    outs[t] = new[0]
                st = new
            y = _stack(ctx, [outs[t] for t in range(steps)], 0)
            if name == "reverse" and self.lens:
                y = ctx.op("ReverseSequence", [y, self.lens], batch_axis=1, time_axis=0)
            ys.append(y)
            finals.append(st)
        y = _stack(ctx, ys, 1)  # [seq, dirs, batch, hidden]
        results = [y] + [_stack(ctx, [f[k] for f in finals], 0) for k in range(len(states))]
        if self.layout:
            results = [ctx.op("Transpose", [results[0]], perm=[2, 0, 1, 3])] + [
                ctx.op("Transpose", [r], perm=[1, 0, 2]) for r in results[1:]]
        return [results[k] if k < len(results) and out else None for k, out in enumerate(self.node.output)]

    def _initial(self, given: str, batch: str) -> str:
        ctx = self.ctx
        if given:
            return ctx.op("Transpose", [given], perm=[1, 0, 2]) if self.layout else given
        shape = ctx.shape_from([len(self.names), batch, self.hidden])
        return ctx.op("ConstantOfShape", [shape], value=ctx.tensor_like(0.0, self.x))

    def _weights(self, d: int):
        """W_dᵀ, R_dᵀ and the two bias halves of direction d (zeros without B)."""
        ctx = self.ctx
        w_t = ctx.op("Transpose", [_pick(ctx, self.w, d)], perm=[1, 0])
        r_t = ctx.op("Transpose", [_pick(ctx, self.r, d)], perm=[1, 0])
        size = GATES[self.op] * self.hidden
        if self.b:
            wb, rb = ctx.op("Split", [_pick(ctx, self.b, d), ctx.ints([size, size])], n=2, axis=0)
        else:
            wb = rb = ctx.const(np.zeros(size, dtype=ctx.value_like(0.0, self.x).dtype))
        return w_t, r_t, wb, rb

    def _step(self, d: int, xt: str, st: list[str]) -> list[str]:
        ctx, hidden, cl = self.ctx, self.hidden, self.clip
        w_t, r_t, wb, rb = self._weights(d)
        acts = self.acts[d]
        h = st[0]
        if self.op == "RNN":
            pre = ctx.op("Add", [ctx.op("Add", [ctx.op("MatMul", [xt, w_t]), ctx.op("MatMul", [h, r_t])]),
                                 ctx.op("Add", [wb, rb])])
            return [acts[0](cl(pre))]
        if self.op == "GRU":
            return [self._gru(xt, h, w_t, r_t, wb, rb, acts)]
        c = st[1]
        gates = ctx.op("Add", [ctx.op("Add", [ctx.op("MatMul", [xt, w_t]), ctx.op("MatMul", [h, r_t])]),
                               ctx.op("Add", [wb, rb])])
        gi, go, gf, gc = ctx.op("Split", [gates, ctx.ints([hidden] * 4)], n=4, axis=1)
        if self.p:
            pi, po, pf = ctx.op("Split", [_pick(ctx, self.p, d), ctx.ints([hidden] * 3)], n=3, axis=0)
            gi, gf = ctx.op("Add", [gi, ctx.op("Mul", [pi, c])]), ctx.op("Add", [gf, ctx.op("Mul", [pf, c])])
        f, g, hf = acts
        i = f(cl(gi))
        # NOTE: input_forget couples the gates (f = 1 - i) and then ignores the f-gate weights
        ft = ctx.op("Sub", [ctx.scalar(1.0, self.x), i]) if attr(self.node, "input_forget", 0) else f(cl(gf))
        c_new = ctx.op("Add", [ctx.op("Mul", [ft, c]), ctx.op("Mul", [i, g(cl(gc))])])
        if self.p:
            go = ctx.op("Add", [go, ctx.op("Mul", [po, c_new])])
        o = f(cl(go))
        return [ctx.op("Mul", [o, hf(c_new)]), c_new]

    def _gru(self, xt, h, w_t, r_t, wb, rb, acts) -> str:
        ctx, hidden, cl = self.ctx, self.hidden, self.clip
        f, g = acts
        xz, xr, xh = ctx.op("Split", [ctx.op("Add", [ctx.op("MatMul", [xt, w_t]), wb]), ctx.ints([hidden] * 3)],
                            n=3, axis=1)
        r_zr, r_h = ctx.op("Split", [r_t, ctx.ints([2 * hidden, hidden])], n=2, axis=1)
        rb_zr, rb_h = ctx.op("Split", [rb, ctx.ints([2 * hidden, hidden])], n=2, axis=0)
        hz, hr = ctx.op("Split", [ctx.op("Add", [ctx.op("MatMul", [h, r_zr]), rb_zr]), ctx.ints([hidden] * 2)],
                        n=2, axis=1)
        z = f(cl(ctx.op("Add", [xz, hz])))
        rt = f(cl(ctx.op("Add", [xr, hr])))
        if attr(self.node, "linear_before_reset", 0):
            recurrent = ctx.op("Mul", [rt, ctx.op("Add", [ctx.op("MatMul", [h, r_h]), rb_h])])
        else:
            recurrent = ctx.op("Add", [ctx.op("MatMul", [ctx.op("Mul", [rt, h]), r_h]), rb_h])
        cand = g(cl(ctx.op("Add", [xh, recurrent])))
        keep = ctx.op("Sub", [ctx.scalar(1.0, self.x), z])
        return ctx.op("Add", [ctx.op("Mul", [keep, cand]), ctx.op("Mul", [z, h])])


@rule("RNN", "GRU", "LSTM")
def recurrent(ctx, node, grads):
    return through(ctx, node, grads, lambda: Unrolled(ctx, node).outputs())
