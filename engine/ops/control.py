"""Control flow: If, Loop, Scan. Subgraphs run through `scope` (see engine.run.subgraphs.Scope), which also
hands them the enclosing graph's values they read by name; gradients flow through autograd.

The branch taken, the trip count and the loop condition are read as Python values: that is
data-dependent control flow on bool/int tensors, never on float data.
"""
from __future__ import annotations

import torch

from ..errors import OnnxGradError
from ..registry import describe, register


def _flag(t) -> bool:
    if t.numel() != 1:
        raise OnnxGradError(f"a condition must hold one value, not shape {tuple(t.shape)}")
    return bool(t.reshape(()).item())


@describe("If", needs="in0", rule=(None,))
@register("If", since=1)
def if_(cond, *, then_branch, else_branch, scope):
    return tuple(scope.run(then_branch if _flag(cond) else else_branch, []))


def _stack(values: list, name: str, device) -> torch.Tensor:
    if not values:
        return torch.zeros((0,), device=device)  # no iteration ran: nothing says the shape
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise OnnxGradError(f"scan output {name!r} must be a tensor in every iteration")
    return torch.stack(values, 0)


@describe("Loop", needs="in",
          rule=(None,
                None,
                "dv_initialᵢ = the body's backward run from the last iteration to the first, carried back"))
@register("Loop", since=1)
def loop(trip_count=None, cond=None, *carried, body, scope, device):
    n = len(carried)
    n_scan = len(body.output) - 1 - n
    if n_scan < 0 or len(body.input) != n + 2:
        raise OnnxGradError(f"Loop body takes {len(body.input)} inputs and returns {len(body.output)} outputs, "
                            f"which does not match {n} loop-carried values")
    limit = None if trip_count is None else int(trip_count.reshape(()).item())
    keep_going = True if cond is None else _flag(cond)
    values = list(carried)
    scans: list[list] = [[] for _ in range(n_scan)]
    i = 0
    while keep_going and (limit is None or i < limit):
        out = scope.run(body, [torch.tensor(i, dtype=torch.int64, device=device),
                               torch.tensor(keep_going, device=device), *values])
        keep_going = _flag(out[0])
        values = list(out[1:1 + n])
        for k in range(n_scan):
            scans[k].append(out[1 + n + k])
        i += 1
    return tuple(values) + tuple(_stack(s, body.output[1 + n + k].name, device) for k, s in enumerate(scans))


def _axes(given, count: int, ranks: list[int]) -> list[int]:
    axes = list(given or []) + [0] * (count - len(given or []))
    return [a + r if a < 0 else a for a, r in zip(axes, ranks)]


def _scan(states, xs, *, body, scope, input_axes, input_dirs, output_axes, output_dirs, device):
    n = len(states)
    n_out = len(body.output) - n
    lengths = {x.shape[a] for x, a in zip(xs, input_axes)}
    if len(lengths) != 1:
        raise OnnxGradError(f"Scan's last {len(xs)} inputs (num_scan_inputs) disagree on the sequence length: "
                            f"{sorted(lengths)}")
    steps = lengths.pop()
    values = list(states)
    collected: list[list] = [[] for _ in range(n_out)]
    for t in range(steps):
        slices = [x.select(a, steps - 1 - t if d else t) for x, a, d in zip(xs, input_axes, input_dirs)]
        out = scope.run(body, [*values, *slices])
        values = list(out[:n])
        for k in range(n_out):
            collected[k].append(out[n + k])
    results = []
    for k, items in enumerate(collected):
        if output_dirs[k]:
            items = items[::-1]
        stacked = _stack(items, body.output[n + k].name, device)
        results.append(stacked.movedim(0, output_axes[k]) if items else stacked)
    return values, results


def _scan_inputs(m: int, given: int, which: str) -> int:
    """num_scan_inputs: the last m inputs are scanned, the rest are states; at least one is scanned."""
    if not 1 <= m <= given:
        raise OnnxGradError(f"Scan: num_scan_inputs = {m}, expected in [1, {given}] (the {given} inputs{which})")
    return m


@describe("Scan", needs="in",
          rule=("dinputsᵢ = the body's backward run over the scan in reverse: states carried back, the scan inputs' slices "
                "stacked",))
@register("Scan", since=9)
def scan(*inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, scope, device):
    m = _scan_inputs(num_scan_inputs, len(inputs), "")
    n = len(inputs) - m
    states, xs = inputs[:n], inputs[n:]
    n_out = len(body.output) - n
    out_ranks = [o.type.tensor_type.shape.dim.__len__() + 1 for o in body.output[n:]]
    values, results = _scan(
        states, xs, body=body, scope=scope, device=device,
        input_axes=_axes(scan_input_axes, m, [x.dim() for x in xs]),
        input_dirs=list(scan_input_directions or []) + [0] * (m - len(scan_input_directions or [])),
        output_axes=_axes(scan_output_axes, n_out, out_ranks),
        output_dirs=list(scan_output_directions or []) + [0] * (n_out - len(scan_output_directions or [])))
    return tuple(values) + tuple(results)


@register("Scan", since=8, until=8)
def scan_8(sequence_lens, *inputs, body, num_scan_inputs, directions=None, scope, device):
    # Opset 8 has a leading batch axis on every input and output and scans axis 1.
    m = _scan_inputs(num_scan_inputs, len(inputs), " after sequence_lens")
    n = len(inputs) - m
    states, xs = inputs[:n], inputs[n:]
    n_out = len(body.output) - n
    dirs = list(directions or []) + [0] * (m - len(directions or []))
    batch = xs[0].shape[0]
    per_state: list[list] = [[] for _ in range(n)]
    per_out: list[list] = [[] for _ in range(n_out)]
    for b in range(batch):
        length = xs[0].shape[1] if sequence_lens is None else int(sequence_lens[b].item())
        values, results = _scan(
            [s[b] for s in states], [x[b, :length] for x in xs], body=body, scope=scope, device=device,
            input_axes=[0] * m, input_dirs=dirs, output_axes=[0] * n_out, output_dirs=[0] * n_out)
        for k, v in enumerate(values):
            per_state[k].append(v)
        for k, r in enumerate(results):
            per_out[k].append(r)
    return tuple(torch.stack(v, 0) for v in per_state) + tuple(torch.stack(r, 0) for r in per_out)


@describe("SequenceMap", needs="in",
          rule=("dinput_sequence = the body's backward run on each element",
                "dadditional_inputs = Σ over the elements of the body's backward"))
@register("SequenceMap", since=17)
def sequence_map(input_sequence, *additional_inputs, body, scope):
    n = len(input_sequence)
    for extra in additional_inputs:
        if isinstance(extra, list) and len(extra) != n:
            raise OnnxGradError(f"SequenceMap sequences differ in length: {n} and {len(extra)}")
    outputs: list[list] = [[] for _ in body.output]
    for i in range(n):
        args = [input_sequence[i]] + [a[i] if isinstance(a, list) else a for a in additional_inputs]
        for k, value in enumerate(scope.run(body, args)):
            outputs[k].append(value)
    return tuple(outputs)
