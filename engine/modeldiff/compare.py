"""`diff(a, b, ...)`: run both sides on the same feeds, then compare A's nodes (units.py) with their
match in B, forward in topological order and gradient in reverse; each node's local error comes from
B's nodes replayed on A's values (tape.py: one run of B whose nodes read A's matched values)."""
from __future__ import annotations

import math
import time

import torch

from .matching import match
from .report import FORWARD, GRADIENT, DiffReport, DiffValues, NodeDiff
from .sides import make_feeds, open_sides
from .tape import reverse, run_tape
from .tolerance import (
    BOUNDED_OPS,
    TINY,
    eps_of,
    inner_length,
    reduction_length,
    relative_error,
    row_length,
    tolerance,
)
from .units import units as make_units
from .verdicts import OVERFLOW, culprits


def diff(a, b=None, y=None, xs=(), zs=(), feeds=None, *, dims=None, past=None, seed=0, dtype=None, against=None,
         device="cpu", keep_values: bool = False) -> DiffReport:
    """Compare A with B (a second model; A run in `dtype` "float16"/"bfloat16"; or `against`
    "onnxruntime") node by node, forward and, with y and xs, gradient. docs/diff.md.
    keep_values: the report's `values` holds both sides' value (and gradient) of every compared tensor."""
    start = time.perf_counter()
    sides = open_sides(a, b, dtype=dtype, against=against)
    xs, zs = _names(xs), _names(zs)
    model_a = sides.a
    feeds, targets, spec, notes = make_feeds(model_a, feeds, y=y, xs=xs, zs=zs, dims=dims, past=past, seed=seed)
    gradient = spec is not None and sides.mode != "onnxruntime"
    on_path = _downstream(model_a.graph, spec.xs) if gradient else set()
    tape_a = run_tape(model_a, feeds, targets, device=device, wanted=on_path)
    if sides.mode == "onnxruntime":
        from .ort import ort_sides

        matching = match(model_a.graph, model_a.graph)
        plain, replay = ort_sides(sides.source, model_a, tape_a, feeds)
        notes += tuple(replay.notes)
        graph_b = None
    else:
        model_b = sides.b
        matching = match(model_a.graph, model_b.graph)
        feeds_b = {matching.tensors[n]: v for n, v in feeds.items() if n in matching.tensors}
        targets_b = [matching.tensors[t] for t in targets if t in matching.tensors]
        if not targets_b:
            from ..errors import DiffError

            raise DiffError(f"B holds none of A's outputs {targets}: nothing to compare")
        feeds_b, _, _, more = make_feeds(model_b, feeds_b, seed=seed, dims=dims, past=past)
        on_path_b = _downstream(model_b.graph, [matching.tensors[x] for x in spec.xs if x in matching.tensors]
                                ) if gradient else set()
        plain = run_tape(model_b, feeds_b, targets_b, dtype=sides.b_dtype, device=device, wanted=on_path_b)
        replay = run_tape(model_b, feeds_b, targets_b, dtype=sides.b_dtype, device=device, wanted=on_path_b,
                          replace=_from_a(tape_a, model_a.graph, matching))
        graph_b = model_b.graph
    units = make_units(model_a.graph, graph_b, matching, tape_a.order)
    weights = set(model_a.graph.initializers)
    saturate = sides.mode == "dtype" and _finite([plain.values.get(matching.tensors.get(t)) for t in targets])
    weight_errors: dict[str, float] = {}
    kept = DiffValues({}, {}) if keep_values else None
    rows = [_forward(u, k, tape_a, plain, replay, matching, sides.mode, weights, saturate, weight_errors)
            for k, u in enumerate(units)]
    if gradient:
        rows += _gradient(units, tape_a, plain, replay, matching, y, weights, on_path, kept)
    elif y is not None and not xs:
        notes += (f"y {y!r} without xs: the gradient is not compared (give xs)",)
    elif y is not None and xs and sides.mode == "onnxruntime":
        notes += ("onnxruntime runs forward only: the gradient is not compared",)
    rows = [r for r in rows if r is not None]
    from .html import graph_edges  # so the report draws A's graph by itself (Jupyter, --html)

    return DiffReport(sides.label_a, sides.label_b, sides.mode, y, tuple(xs), tuple(zs), tuple(rows),
                      culprits(rows, units), matching.unmatched, len(matching.tensors),
                      time.perf_counter() - start, tuple(notes), edges=graph_edges(model_a.graph),
                      values=_forward_values(kept, units, tape_a, plain, matching))


def _forward_values(kept, units, tape_a, plain, matching):
    if kept is None:
        return None
    for u in units:
        for t in u.outputs:
            kept.forward[t] = (_numpy(tape_a.values.get(t)), _numpy(_value(plain, matching.tensors.get(t))))
    return kept


def _numpy(value):
    if not isinstance(value, torch.Tensor):
        return None
    from ..dtypes import to_numpy

    return to_numpy(value)


def _names(names) -> list[str]:
    if isinstance(names, str):
        return [n for n in names.split(",") if n]
    return list(names)


def _from_a(tape_a, graph_a, matching):
    """B's replay reads A's value wherever B's tensor stands for one A computed (never for inputs and
    initializers: a changed weight must show at its consumer)."""
    produced = {t for n in graph_a.nodes for t in n.output if t}
    of_b = {b: a for a, b in matching.tensors.items() if a in produced}

    def replace(name, value):
        a = of_b.get(name)
        v = tape_a.values.get(a) if a is not None else None
        if v is None or not isinstance(v, torch.Tensor) or v.shape != value.shape:
            return None
        return v.to(value.dtype) if v.dtype != value.dtype else v

    return replace


def _value(side, name):
    return side.values.get(name) if name is not None else None


def _worst(pairs, saturate: bool = False, floor: float = TINY) -> float:
    errs = [relative_error(x, y, saturate, floor) for x, y in pairs
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)]
    return max(errs, default=0.0)


def _eps(*values) -> float:
    return max((eps_of(v.dtype) for v in values if isinstance(v, torch.Tensor)), default=0.0)


def _forward(u, order, tape_a, plain, replay, matching, mode, weights, saturate, weight_errors) -> NodeDiff | None:
    m = matching.tensors
    outs_a = [tape_a.values.get(t) for t in u.outputs]
    pairs = [(tape_a.values.get(t), _value(plain, m[t])) for t in u.outputs]
    local_pairs = [(tape_a.values.get(t), _value(replay, m[t])) for t in u.outputs]
    if not any(isinstance(x, torch.Tensor) and isinstance(z, torch.Tensor) for x, z in local_pairs):
        return None
    ins = [(t, tape_a.values.get(t), _value(plain, m.get(t))) for t in u.inputs]
    eps = max(_eps(*outs_a, *(v for _, v in local_pairs)), _b_eps(u, replay))
    ins_a = [v for _, v, _ in ins]
    tol = tolerance(eps, max(reduction_length(ins_a, outs_a), row_length(u.op_type, outs_a),
                             inner_length(u.op_type, ins_a)))
    floor = 1.0 if u.op_type in BOUNDED_OPS else TINY
    local = _worst(local_pairs, saturate, floor)
    notes = [u.note] if u.note else []
    for t, va, vb in ins:  # a weight that differs shows here, at its consumer
        if t not in weights:
            continue
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.shape != vb.shape:
            continue  # a weight stored otherwise (transposed for transB) is judged by the node's output
        if t not in weight_errors:  # once per weight: an embedding table is read by one node, a bias by many
            weight_errors[t] = _worst([(va, vb)])
        e = weight_errors[t]
        if e > tolerance(_eps(va, vb)):
            notes.append(f"initializer {t!r} differs (error {e:.2g})")
    if not saturate and _overflow_begins(pairs, [vb for _, _, vb in ins]):
        notes.append(("float16 " if mode == "dtype" else "") + OVERFLOW + " (B's values turn non-finite)")
    return NodeDiff(u.name, u.op_type, FORWARD, order, _b_names(u, plain), u.outputs, _worst(pairs, saturate, floor), local, tol,
                    _beyond(local, tol), tuple((t, _worst([(va, vb)])) for t, va, vb in ins if t not in weights
                                               and isinstance(va, torch.Tensor) and va.is_floating_point()),
                    "; ".join(notes))


def _b_eps(u, side) -> float:
    """The lowest precision B computes the unit in: a cast model's float16 inside a float32 Cast."""
    graph = getattr(side, "graph", None)
    if graph is None:
        return 0.0
    names = [t for j in u.b_nodes for t in (*graph.nodes[j].input, *graph.nodes[j].output) if t]
    return _eps(*(side.values.get(t) for t in names))


def _finite(values) -> bool:
    """Every output B computed is finite: its ±inf in between (a mask's most negative float) were absorbed."""
    return all(not isinstance(v, torch.Tensor) or not v.is_floating_point() or bool(torch.isfinite(v).all())
               for v in values)


def _beyond(error: float, tol: float) -> bool:
    return math.isnan(error) or error > tol


def _overflow_begins(pairs, inputs_b) -> bool:
    """B's output turned non-finite where A's is finite, from inputs B still held finite."""
    def finite(v):
        return not isinstance(v, torch.Tensor) or not v.is_floating_point() or bool(torch.isfinite(v).all())
    return (any(finite(va) and not finite(vb) for va, vb in pairs if vb is not None)
            and all(finite(v) for v in inputs_b))


def _b_names(u, side) -> tuple[str, ...]:
    graph = getattr(side, "graph", None)
    return tuple(graph.nodes[j].name for j in u.b_nodes) if graph is not None else ()


def _gradient(units, tape_a, plain, replay, matching, y, weights, on_path, kept=None) -> list[NodeDiff]:
    """Reverse order: what each unit sends back from A's incoming gradient, by A's rule and by B's (replayed
    on A's values); the accumulated error is A's sending against B's own backward. A weight that B holds
    otherwise (scaled, transposed) is another parameter: its gradient is not compared, its consumer's
    forward already diverges or agrees."""
    m = matching.tensors
    if y not in m or y not in tape_a.values:
        return []
    by_a, by_b = {}, {}  # what each node sent in the two backward passes: a one-node unit's sending, kept
    grads_a = reverse(tape_a, tape_a.order, {y: torch.ones_like(tape_a.values[y])}, by_a)
    y_b = plain.values.get(m[y])
    grads_b = reverse(plain, plain.order, {m[y]: torch.ones_like(y_b)}, by_b) if y_b is not None else {}
    rows = []
    for k, u in enumerate(reversed(units)):
        incoming = {t: grads_a[t] for t in u.outputs if t in grads_a}
        if not incoming:
            continue
        sent_a = by_a.get(u.a_nodes[0], {}) if len(u.a_nodes) == 1 else _send(tape_a, u.a_nodes, incoming)
        sent_r = _send(replay, u.b_nodes, {m[t]: g for t, g in incoming.items()})
        sent_b = by_b.get(u.b_nodes[0], {}) if len(u.b_nodes) == 1 else _send(
            plain, u.b_nodes, {m[t]: grads_b[m[t]] for t in u.outputs if m[t] in grads_b})
        targets = [t for t in dict.fromkeys(u.inputs) if t in on_path and (t in sent_a or m.get(t) in sent_r)
                   and not (t in weights and _differs(tape_a.values.get(t), plain.values.get(m.get(t))))]
        if not targets:
            continue
        local = _worst((_or_zeros(sent_a.get(t), sent_r.get(m.get(t))), _or_zeros(sent_r.get(m.get(t)),
                        sent_a.get(t))) for t in targets)
        error = _worst((_or_zeros(sent_a.get(t), sent_b.get(m.get(t))), _or_zeros(sent_b.get(m.get(t)),
                        sent_a.get(t))) for t in targets)
        eps = max(_eps(*(sent_r.get(m.get(t)) for t in targets), *(sent_a.get(t) for t in targets)),
                  _b_eps(u, replay))
        sent = [sent_a[t] for t in targets if t in sent_a]
        red = max(reduction_length(list(incoming.values()), sent), reduction_length(sent, list(incoming.values())),
                  row_length(u.op_type, sent))
        tol = tolerance(eps, red)
        arrived = tuple((t, _worst([(g, grads_b.get(m[t]))])) for t, g in incoming.items())
        if kept is not None:
            kept.gradient.update({t: (_numpy(g), _numpy(grads_b.get(m[t]))) for t, g in incoming.items()})
        rows.append(NodeDiff(u.name, u.op_type, GRADIENT, k, _b_names(u, plain), u.outputs, error, local, tol,
                             _beyond(local, tol), arrived, u.note))
    return rows


def _downstream(graph, xs) -> set[str]:
    """The tensors computed from xs (xs included): the gradient y sends anywhere else (a mask
    constant, a position table) is no part of the selection and is not compared."""
    reached = set(xs)
    for node in graph.nodes:  # topological
        if any(t in reached for t in node.input if t):
            reached.update(t for t in node.output if t)
    return reached


def _differs(va, vb) -> bool:
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.shape != vb.shape:
        return True
    return relative_error(va, vb) > tolerance(_eps(va, vb))


def _send(tape, nodes, seeds) -> dict:
    """What a run of nodes sends to the tensors entering it from `seeds` at its outputs."""
    if not nodes or not seeds:
        return {} if nodes else dict(seeds)  # no node of B: it hands the value on (an identity it dropped)
    grads = reverse(tape, sorted(nodes, key=_position(tape)), seeds)
    return {n: g for n, g in grads.items() if n not in seeds}


def _position(tape):
    where = {i: k for k, i in enumerate(tape.order)}
    return lambda i: where.get(i, i)


def _or_zeros(value, like):
    """A gradient one side does not send (an op without a rule, a zero path) is zero there."""
    if value is None and isinstance(like, torch.Tensor):
        return torch.zeros_like(like)
    return value
