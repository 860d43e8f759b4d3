"""Recurrent ops: RNN, GRU, LSTM as explicit time loops, one gate layout per ONNX spec.

Shapes (layout 0): X [seq, batch, input]; W [dirs, gates*hidden, input]; R [dirs, gates*hidden,
hidden]; B [dirs, 2*gates*hidden] = Wb then Rb; Y [seq, dirs, batch, hidden]; Y_h/Y_c [dirs,
batch, hidden]. layout 1 swaps seq and batch (X, Y) or puts batch first (initial states, Y_h, Y_c).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import computes_in_float32
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register

# name -> (fn(x, alpha, beta), default alpha, default beta); alpha/beta None when unused.
_ACTIVATIONS = {
    "relu": (lambda x, a, b: torch.relu(x), None, None),
    "tanh": (lambda x, a, b: torch.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: torch.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: F.leaky_relu(x, a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x)), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * torch.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: torch.clamp(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: F.elu(x, a), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + x.abs()), None, None),
    "softplus": (lambda x, a, b: F.softplus(x), None, None),
}


def _activations(op, names, alphas, betas, defaults, dirs):
    """Bind each direction's activation functions, consuming alpha/beta lists in order."""
    names = list(names) if names else list(defaults) * dirs
    if len(names) != len(defaults) * dirs:
        raise OnnxGradError(f"{op}: expected {len(defaults) * dirs} activations, got {names}")
    alphas, betas = list(alphas or []), list(betas or [])
    bound = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise UnsupportedOpError(f"{op}: activation {name!r} is not supported (use one of {', '.join(_ACTIVATIONS)})")
        fn, da, db = _ACTIVATIONS[key]
        a = (alphas.pop(0) if alphas else da) if da is not None else None
        b = (betas.pop(0) if betas else db) if db is not None else None
        bound.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    k = len(defaults)
    return [bound[d * k:(d + 1) * k] for d in range(dirs)]


def _directions(direction, w):
    if direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedOpError(f"direction={direction!r} is not supported (use forward, reverse or bidirectional)")
    dirs = 2 if direction == "bidirectional" else 1
    if w.shape[0] != dirs:
        raise OnnxGradError(f"direction={direction!r} needs {dirs} weight directions, W has {w.shape[0]}")
    return ["forward", "reverse"] if dirs == 2 else [direction]


def _reverse_index(seq_len, batch, lens, device):
    """Per-batch time index that reverses only each sequence's valid prefix (an involution)."""
    t = torch.arange(seq_len, device=device).unsqueeze(1).expand(seq_len, batch)
    if lens is None:
        return seq_len - 1 - t
    lens = lens.to(device).unsqueeze(0)
    return torch.where(t < lens, lens - 1 - t, t)


def _time_gather(x, index):
    """x [seq, batch, ...] reordered in time per batch column by index [seq, batch]."""
    idx = index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(x.shape)
    return torch.gather(x, 0, idx)


def _run(op, step, x, states, w, direction, sequence_lens, layout, n_outputs):
    """Drive `step(d, x_t, states) -> states` (states[0] is h) over time for every direction."""
    if layout not in (0, 1):
        raise UnsupportedOpError(f"{op}: layout={layout} is not supported (0 or 1)")
    if layout == 1:
        x = x.transpose(0, 1)
        states = [None if s is None else s.transpose(0, 1) for s in states]
    seq_len, batch = x.shape[0], x.shape[1]
    lens = None if sequence_lens is None else sequence_lens.to(torch.int64)
    valid = None
    if lens is not None:
        valid = torch.arange(seq_len, device=x.device).unsqueeze(1) < lens.to(x.device).unsqueeze(0)
    ys, finals = [], []
    for d, name in enumerate(_directions(direction, w)):
        xd = x
        if name == "reverse":
            rev = _reverse_index(seq_len, batch, lens, x.device)
            xd = _time_gather(x, rev)
        st = [s[d] for s in states]
        outs = []
        for t in range(seq_len):
            new = step(d, xd[t], st)
            if valid is not None:
                # NOTE: past a sequence's length the state is frozen and Y is 0.
                m = valid[t].unsqueeze(1)
                new = [torch.where(m, n, o) for n, o in zip(new, st)]
                outs.append(torch.where(m, new[0], torch.zeros_like(new[0])))
            else:
                outs.append(new[0])
            st = new
        y = torch.stack(outs, 0) if outs else x.new_zeros((0, batch, st[0].shape[-1]))
        if name == "reverse":
            y = _time_gather(y, rev)
        ys.append(y)
        finals.append(st)
    y = torch.stack(ys, 1)  # [seq, dirs, batch, hidden]
    results = [y] + [torch.stack([f[k] for f in finals], 0) for k in range(len(states))]
    if layout == 1:
        results = [results[0].permute(2, 0, 1, 3)] + [r.transpose(0, 1) for r in results[1:]]
    results = results[:max(n_outputs, 1)]
    return results[0] if n_outputs == 1 else tuple(results)


def _init_state(s, dirs, batch, hidden, like, layout):
    if s is not None:
        return s
    return like.new_zeros((batch, dirs, hidden) if layout == 1 else (dirs, batch, hidden))


def _split_bias(b, dirs, gates, hidden, like):
    if b is None:
        z = like.new_zeros((dirs, gates * hidden))
        return z, z
    return b[:, :gates * hidden], b[:, gates * hidden:]


def _clip(clip):
    return (lambda v: v) if clip is None else (lambda v: torch.clamp(v, -clip, clip))


# The rule lines RNN, GRU and LSTM share (LSTM adds its cell state and peepholes).
_RECURRENT = ("dX = Σₜ dZₜ · W   # Z the gates' pre-activations, dZ sent back through time (BPTT)",
              "dW = Σₜ dZₜᵀ · Xₜ",
              "dR = Σₜ dZₜᵀ · Hₜ₋₁",
              "dB = Σₜ dZₜ, for both halves (Wb and Rb)",
              None,
              "dinitial_h = the hidden state's gradient carried back past the first step")


@describe("RNN", needs="in,out",
          rule=_RECURRENT)
@register("RNN", since=1)
@computes_in_float32  # NOTE: in half, rounding compounds over the steps and saturated gates' derivatives underflow
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, output_sequence=0, n_outputs=1):
    dirs, hidden = w.shape[0], r.shape[-1]
    acts = _activations("RNN", activations, activation_alpha, activation_beta, ["Tanh"], dirs)
    batch = x.shape[1 - layout] if layout in (0, 1) else 0
    wb, rb = _split_bias(b, dirs, 1, hidden, x)
    cl = _clip(clip)

    def step(d, xt, st):
        (h,) = st
        return [acts[d][0](cl(xt @ w[d].T + h @ r[d].T + wb[d] + rb[d]))]

    h0 = _init_state(initial_h, dirs, batch, hidden, x, layout)
    return _run("RNN", step, x, [h0], w, direction, sequence_lens, layout, n_outputs)


@describe("GRU", needs="in,out",
          rule=_RECURRENT)
@register("GRU", since=1)
@computes_in_float32  # NOTE: in half, rounding compounds over the steps and saturated gates' derivatives underflow
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, linear_before_reset=0, output_sequence=0, n_outputs=1):
    dirs, hidden = w.shape[0], r.shape[-1]
    acts = _activations("GRU", activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], dirs)
    batch = x.shape[1 - layout] if layout in (0, 1) else 0
    wb, rb = _split_bias(b, dirs, 3, hidden, x)
    cl = _clip(clip)
    H = hidden

    def step(d, xt, st):
        (h,) = st
        f, g = acts[d]
        xw = xt @ w[d].T + wb[d]  # gates z, r, h
        hr = h @ r[d][:2 * H].T + rb[d][:2 * H]
        z = f(cl(xw[:, :H] + hr[:, :H]))
        rt = f(cl(xw[:, H:2 * H] + hr[:, H:]))
        if linear_before_reset:
            cand = g(cl(xw[:, 2 * H:] + rt * (h @ r[d][2 * H:].T + rb[d][2 * H:])))
        else:
            cand = g(cl(xw[:, 2 * H:] + (rt * h) @ r[d][2 * H:].T + rb[d][2 * H:]))
        return [(1 - z) * cand + z * h]

    h0 = _init_state(initial_h, dirs, batch, hidden, x, layout)
    return _run("GRU", step, x, [h0], w, direction, sequence_lens, layout, n_outputs)


@describe("LSTM", needs="in,out",
          rule=_RECURRENT + (
                "dinitial_c = the cell state's gradient carried back past the first step",
                "dP = Σₜ dZₜ ⊙ C on the peephole gates"))
@register("LSTM", since=1)
@computes_in_float32  # NOTE: in half, rounding compounds over the steps and saturated gates' derivatives underflow
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
         hidden_size=None, input_forget=0, layout=0, output_sequence=0, n_outputs=1):
    dirs, hidden = w.shape[0], r.shape[-1]
    acts = _activations("LSTM", activations, activation_alpha, activation_beta,
                        ["Sigmoid", "Tanh", "Tanh"], dirs)
    batch = x.shape[1 - layout] if layout in (0, 1) else 0
    wb, rb = _split_bias(b, dirs, 4, hidden, x)
    peep = p if p is not None else x.new_zeros((dirs, 3 * hidden))
    cl = _clip(clip)
    H = hidden

    def step(d, xt, st):
        h, c = st
        f, g, hf = acts[d]
        gates = xt @ w[d].T + h @ r[d].T + wb[d] + rb[d]  # gates i, o, f, c
        pi, po, pf = peep[d][:H], peep[d][H:2 * H], peep[d][2 * H:]
        i = f(cl(gates[:, :H] + pi * c))
        # NOTE: input_forget couples the gates (f = 1 - i) and then ignores the f-gate weights.
        ft = 1 - i if input_forget else f(cl(gates[:, 2 * H:3 * H] + pf * c))
        c_new = ft * c + i * g(cl(gates[:, 3 * H:]))
        o = f(cl(gates[:, H:2 * H] + po * c_new))
        return [o * hf(c_new), c_new]

    h0 = _init_state(initial_h, dirs, batch, hidden, x, layout)
    c0 = _init_state(initial_c, dirs, batch, hidden, x, layout)
    return _run("LSTM", step, x, [h0, c0], w, direction, sequence_lens, layout, n_outputs)
