"""`diff(a, b, ...)`: run both sides on the same feeds, then compare A's nodes (units.py) with their
match in B, forward in topological order and gradient in reverse; each node's local error comes from
B's nodes replayed on A's values (tape.py: one run of B whose nodes read A's matched values). B's runs
stream into their measures (measure.py); the gradient goes in phases (backward.py)."""
from __future__ import annotations

import math
import time

import torch

from .backward import GradientPhases
from .matching import match
from .measure import Measured, as_numpy, b_names_of
from .report import FORWARD, DiffReport, DiffValues, NodeDiff
from .sides import make_feeds, open_sides
from .tape import Tape, run_tape
from .tolerance import (
    BOUNDED_OPS,
    TINY,
    all_finite,
    eps_of_dtypes,
    eps_of_values,
    inner_length,
    reduction_length,
    row_length,
    tolerance,
)
from .units import units as make_units
from .verdicts import OVERFLOW, culprits


def diff(a, b=None, y=None, xs=(), zs=(), feeds=None, *, dims=None, past=None, seed=0, dtype=None, against=None,
         device="cpu", keep_values: bool = False) -> DiffReport:
    """Compare A with B (a second model; A run in `dtype` "float16"/"bfloat16"; or `against`
    "onnxruntime") node by node, forward and, with y and xs, gradient. docs/diff.md.
    keep_values: the report's `values` holds both sides' value (and gradient) of every compared tensor.

    A's values are held throughout (B's replay reads them); B's two runs stream: each value is
    compared with A's as B computes it, then dropped after its last reader (measure.py, backward.py)."""
    start = time.perf_counter()
    sides = open_sides(a, b, dtype=dtype, against=against)
    xs, zs = _names(xs), _names(zs)
    model_a = sides.a
    feeds, targets, spec, notes = make_feeds(model_a, feeds, y=y, xs=xs, zs=zs, dims=dims, past=past, seed=seed)
    gradient = spec is not None and sides.mode != "onnxruntime"
    on_path = _downstream(model_a.graph, spec.xs) if gradient else set()
    tape_a = run_tape(model_a, feeds, targets, device=device, wanted=on_path)
    kept = DiffValues({}, {}) if keep_values else None
    graph_b = None if sides.mode == "onnxruntime" else sides.b.graph
    matching = match(model_a.graph, graph_b if graph_b is not None else model_a.graph)
    units = make_units(model_a.graph, graph_b, matching, tape_a.order)
    floors = {t: 1.0 if u.op_type in BOUNDED_OPS else TINY for u in units for t in u.outputs}
    of_b = b_names_of(matching)
    plain = Measured(tape_a.values, of_b, floors, keep_values)
    replay = Measured(tape_a.values, of_b, floors)
    weights = set(model_a.graph.initializers)
    phases = GradientPhases(units, tape_a, matching, y, weights, on_path, kept) if gradient else None
    if sides.mode == "onnxruntime":
        from .ort import ort_sides

        ort_plain, ort_replay = ort_sides(sides.source, model_a, tape_a, feeds)
        plain.measure_all(ort_plain.values)
        replay.measure_all(ort_replay.values)
        notes += tuple(ort_replay.notes)
    else:
        _run_b(sides, model_a, matching, feeds, targets, plain, replay, phases, tape_a, on_path, seed, dims, past,
               device, spec)
    saturate = sides.mode == "dtype" and all(plain.finite.get(matching.tensors.get(t), True) for t in targets)
    rows = [_forward(u, k, tape_a.values, plain, replay, matching, sides.mode, weights, saturate, graph_b)
            for k, u in enumerate(units)]
    if phases is not None:
        rows += phases.finish()
    elif y is not None and not xs:
        notes += (f"y {y!r} without xs: the gradient is not compared (give xs)",)
    elif y is not None and xs and sides.mode == "onnxruntime":
        notes += ("onnxruntime runs forward only: the gradient is not compared",)
    rows = [r for r in rows if r is not None]
    if kept is not None:
        kept.forward.update({t: (as_numpy(tape_a.values.get(t)), plain.kept.get(t)) for u in units for t in u.outputs})
    from .html import graph_edges  # so the report draws A's graph by itself (Jupyter, --html)

    return DiffReport(sides.label_a, sides.label_b, sides.mode, y, tuple(xs), tuple(zs), tuple(rows),
                      culprits(rows, units), matching.unmatched, len(matching.tensors),
                      time.perf_counter() - start, tuple(notes), edges=graph_edges(model_a.graph), values=kept)


def _run_b(sides, model_a, matching, feeds, targets, plain, replay, phases, tape_a, on_path, seed, dims, past,
           device, spec) -> None:
    """B's own run, then B replayed on A's values, each streamed into its measures; with a gradient,
    B's own run keeps its records for its backward (phase 2) and the replay is compared unit by unit."""
    model_b = sides.b
    m = matching.tensors
    feeds_b = {m[n]: v for n, v in feeds.items() if n in m}
    targets_b = [m[t] for t in targets if t in m]
    if not targets_b:
        from ..errors import DiffError

        raise DiffError(f"B holds none of A's outputs {targets}: nothing to compare")
    feeds_b, _, _, _ = make_feeds(model_b, feeds_b, seed=seed, dims=dims, past=past)
    on_path_b = _downstream(model_b.graph, [m[x] for x in spec.xs if x in m]) if phases is not None else set()
    y_b = {m[spec.y]} if phases is not None and spec.y in m else set()
    own = Tape(keep=y_b.__contains__, seen=plain)
    run_tape(model_b, feeds_b, targets_b, dtype=sides.b_dtype, device=device, wanted=on_path_b, tape=own)
    if phases is not None:
        phases.own(own, plain)
    del own
    again = Tape(keep=_nothing, seen=replay)
    if phases is not None:
        phases.streaming(again, replay.dtypes)
    run_tape(model_b, feeds_b, targets_b, dtype=sides.b_dtype, device=device, wanted=on_path_b,
             replace=_from_a(tape_a, model_a.graph, matching), tape=again)


def _nothing(name) -> bool:
    return False


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


def _forward(u, order, values_a, plain, replay, matching, mode, weights, saturate, graph_b) -> NodeDiff | None:
    m = matching.tensors
    measured = [t for t in u.outputs if t in replay.unit_errors]
    if not measured:
        return None
    pick = 1 if saturate else 0
    error = max((plain.unit_errors[t][pick] for t in u.outputs if t in plain.unit_errors), default=0.0)
    local = max(replay.unit_errors[t][pick] for t in measured)
    outs_a = [values_a.get(t) for t in u.outputs]
    ins_a = [values_a.get(t) for t in u.inputs]
    b_names = [t for j in u.b_nodes for t in (*graph_b.nodes[j].input, *graph_b.nodes[j].output) if t] \
        if graph_b is not None else []
    eps = max(eps_of_values(*outs_a), eps_of_dtypes(*(replay.dtypes.get(m[t]) for t in measured)),
              eps_of_dtypes(*(replay.dtypes.get(t) for t in b_names)))
    tol = tolerance(eps, max(reduction_length(ins_a, outs_a), row_length(u.op_type, outs_a),
                             inner_length(u.op_type, ins_a)))
    notes = [u.note] if u.note else []
    for t in u.inputs:  # a weight that differs shows here, at its consumer
        if t in weights and plain.same_shape.get(t) and plain.beyond_rounding(t, m.get(t)):
            notes.append(f"initializer {t!r} differs (error {plain.errors[t]:.2g})")
    if not saturate and _overflow_begins(u, values_a, plain, m):
        notes.append(("float16 " if mode == "dtype" else "") + OVERFLOW + " (B's values turn non-finite)")
    inputs = tuple((t, plain.errors.get(t, 0.0)) for t, va in zip(u.inputs, ins_a)
                   if t not in weights and isinstance(va, torch.Tensor) and va.is_floating_point())
    return NodeDiff(u.name, u.op_type, FORWARD, order, tuple(graph_b.nodes[j].name for j in u.b_nodes)
                    if graph_b is not None else (), u.outputs, error, local, tol, _beyond(local, tol), inputs,
                    "; ".join(notes))


def _beyond(error: float, tol: float) -> bool:
    return math.isnan(error) or error > tol


def _overflow_begins(u, values_a, plain, m) -> bool:
    """B's output turned non-finite where A's is finite, from inputs B still held finite."""
    def finite(v):
        return not isinstance(v, torch.Tensor) or all_finite(v)
    turned = any(not plain.finite[m[t]] and finite(values_a.get(t)) for t in u.outputs if m.get(t) in plain.finite)
    return turned and all(plain.finite.get(m.get(t), True) for t in u.inputs)


def _downstream(graph, xs) -> set[str]:
    """The tensors computed from xs (xs included): the gradient y sends anywhere else (a mask
    constant, a position table) is no part of the selection and is not compared."""
    reached = set(xs)
    for node in graph.nodes:  # topological
        if any(t in reached for t in node.input if t):
            reached.update(t for t in node.output if t)
    return reached
