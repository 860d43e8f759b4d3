"""The gradient half of a diff, in three phases so that no run's records outlive their use:

1. A: the gradient flowing into every tensor from y (seeded with ones), and what each unit sends
   back from it by A's rule; A's records are then dropped (its values stay: B's replay reads them).
2. B's own run: its backward from y, what each unit sends in it (the accumulated `error`) and the
   gradient each unit's outputs received (`input_errors`); B's records are then dropped.
3. B replayed on A's values, streamed: as soon as a unit's B nodes have run, what they send from A's
   incoming gradient is compared with A's sending (the `local_error`) and their records dropped.

A weight that B holds otherwise (scaled, transposed) is another parameter: its gradient is not
compared, its consumer's forward already diverges or agrees."""
from __future__ import annotations

import math

import torch

from .measure import as_numpy
from .report import GRADIENT, NodeDiff
from .tape import reverse, vjp_in
from .tolerance import eps_of_dtypes, eps_of_values, reduction_length, relative_error, row_length, tolerance


class GradientPhases:
    def __init__(self, units, tape_a, matching, y: str, weights: set[str], on_path: set[str], kept=None):
        self.units, self.m, self.y, self.weights, self.on_path, self.kept = (
            units, matching.tensors, y, weights, on_path, kept)
        self.incoming: dict[int, dict] = {}  # unit index -> A's gradient at its outputs
        self.sent_a: dict[int, dict] = {}
        self.error: dict[int, float] = {}
        self.arrived: dict[int, tuple] = {}
        self.rows: dict[int, NodeDiff] = {}
        self.replay, self.b_dtypes = None, {}
        self._differs: set[str] = set()  # weights B holds otherwise: their gradients are not compared
        self._pending: dict[int, set[int]] = {}
        self._units_of: dict[int, list[int]] = {}
        self._a(tape_a)

    def _a(self, tape_a) -> None:
        y, m = self.y, self.m
        if y not in m or y not in tape_a.values:
            return
        by_a: dict = {}
        grads_a = reverse(tape_a, tape_a.order, {y: torch.ones_like(tape_a.values[y])}, by_a)
        for k, u in enumerate(self.units):
            incoming = {t: grads_a[t] for t in u.outputs if t in grads_a}
            if incoming:
                self.incoming[k] = incoming
                self.sent_a[k] = by_a.get(u.a_nodes[0], {}) if len(u.a_nodes) == 1 else send(tape_a, u.a_nodes, incoming)
        tape_a.records.clear()

    def own(self, plain, measured_b) -> None:
        """Phase 2, once B's own run is done (its records held): B's backward, then its records dropped."""
        m = self.m
        y_b = plain.values.get(m.get(self.y))
        by_b: dict = {}
        grads_b = reverse(plain, plain.order, {m[self.y]: torch.ones_like(y_b)}, by_b) if y_b is not None else {}
        self._differs = {t for t in self.weights if not measured_b.same_shape.get(t, False)
                         or measured_b.beyond_rounding(t, m.get(t))}
        for k, incoming in self.incoming.items():
            u = self.units[k]
            sent_b = by_b.get(u.b_nodes[0], {}) if len(u.b_nodes) == 1 else send(
                plain, u.b_nodes, {m[t]: grads_b[m[t]] for t in u.outputs if m[t] in grads_b})
            sent_a = self.sent_a[k]
            targets = self._targets(u, sent_a, sent_b)
            self.error[k] = worst((or_zeros(sent_a.get(t), sent_b.get(m.get(t))),
                                   or_zeros(sent_b.get(m.get(t)), sent_a.get(t))) for t in targets)
            self.arrived[k] = tuple((t, worst([(g, grads_b.get(m[t]))])) for t, g in incoming.items())
            if self.kept is not None:
                self.kept.gradient.update({t: (as_numpy(g), as_numpy(grads_b.get(m[t]))) for t, g in incoming.items()})
        plain.records.clear()

    def _targets(self, u, sent_a, sent_b) -> list[str]:
        """The inputs compared: on the path from xs, sent something by either side, not a changed weight."""
        m = self.m
        return [t for t in dict.fromkeys(u.inputs) if t in self.on_path and (t in sent_a or m.get(t) in sent_b)
                and t not in self._differs]

    def streaming(self, replay, b_dtypes) -> None:
        """Phase 3: `replay` is the tape B's replay runs on; its `done` hook compares each unit as
        soon as its B nodes have run. `b_dtypes`: the replay's dtypes by B name (for the tolerance)."""
        self.replay, self.b_dtypes = replay, b_dtypes
        self._pending = {k: set(self.units[k].b_nodes) for k in self.incoming}
        self._units_of = {}
        for k, nodes in self._pending.items():
            for j in nodes:
                self._units_of.setdefault(j, []).append(k)
        replay.done = self._done

    def _done(self, j: int) -> None:
        waiting = self._units_of.get(j)
        if not waiting:
            self.replay.records.pop(j, None)  # no unit reads what this node sends
            return
        for k in waiting:
            pending = self._pending.get(k)
            if pending is not None:
                pending.discard(j)
                if not pending:
                    self._compare(k)

    def finish(self) -> list[NodeDiff]:
        """Units whose B nodes did not all run (or that B holds as a value) are compared with what ran."""
        if self.replay is not None:
            for k in list(self._pending):
                self._compare(k)
        order = len(self.units)
        return [self.rows[k] for k in sorted(self.rows, key=lambda k: order - k)]

    def _compare(self, k: int) -> None:
        u, m, incoming, sent_a = self.units[k], self.m, self.incoming[k], self.sent_a.pop(k)
        del self._pending[k]
        sent_r = send(self.replay, u.b_nodes, {m[t]: g for t, g in incoming.items()})
        targets = self._targets(u, sent_a, sent_r)
        local = worst((or_zeros(sent_a.get(t), sent_r.get(m.get(t))), or_zeros(sent_r.get(m.get(t)), sent_a.get(t)))
                      for t in targets) if targets else 0.0
        record = self.replay.records.get(u.b_nodes[0]) if len(u.b_nodes) == 1 else None  # for _noise
        for j in u.b_nodes:  # the records no other unit waits for
            readers = self._units_of.get(j, [])
            if all(r not in self._pending for r in readers):
                self.replay.records.pop(j, None)
        if not targets:
            return
        names = [t for j in u.b_nodes for t in _node_names(self.replay.graph, j)]
        eps = max(eps_of_values(*(sent_r.get(m.get(t)) for t in targets), *(sent_a.get(t) for t in targets)),
                  eps_of_dtypes(*(self.b_dtypes.get(t) for t in names)))
        sent = [sent_a[t] for t in targets if t in sent_a]
        red = max(reduction_length(list(incoming.values()), sent), reduction_length(sent, list(incoming.values())),
                  row_length(u.op_type, sent))
        tol = tolerance(eps, red)
        note = u.note
        noise = self._noise(record, incoming, targets, sent_a) if local > tol else 0.0
        if NOISE_UNITS * noise > tol:
            tol = NOISE_UNITS * noise
            note = "; ".join(filter(None, (note, f"tolerance {NOISE_UNITS:g}x this node's own rounding here ({noise:.2g})")))
        graph_b = self.replay.graph
        self.rows[k] = NodeDiff(u.name, u.op_type, GRADIENT, len(self.units) - 1 - k,
                                tuple(graph_b.nodes[j].name for j in u.b_nodes), u.outputs, self.error.get(k, 0.0),
                                local, tol, math.isnan(local) or local > tol, self.arrived.get(k, ()), note)
        del self.incoming[k]

    def _noise(self, record, incoming, targets, sent_a) -> float:
        """How far the node's own rounding moves what it sends, on these very values: B's node run
        again in A's precision and in float64 (a one-node unit of B). A gradient that nearly cancels
        (a LayerNorm's whose scale is ~1, seeded with ones) loses digits in any implementation; a
        difference within a few times that is no divergence. 0 where there is no estimate."""
        m = self.m
        dtypes = {v.dtype for v in sent_a.values() if isinstance(v, torch.Tensor)}
        if record is None or not record.call or not targets or len(dtypes) != 1 or torch.float64 in dtypes:
            return 0.0
        seeds = {m[t]: g for t, g in incoming.items()}
        low, high = vjp_in(record, seeds, dtypes.pop()), vjp_in(record, seeds, torch.float64)
        return worst((high.get(m.get(t)), low.get(m.get(t))) for t in targets)


# A node's own rounding on the values at hand, measured (GradientPhases._noise): B's and A's ways each
# carry about one such error, so a few of them is the least a tolerance can be.
NOISE_UNITS = 4.0


def _node_names(graph, j: int):
    node = graph.nodes[j]
    return [t for t in (*node.input, *node.output) if t]


def worst(pairs) -> float:
    errs = [relative_error(x, y) for x, y in pairs if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)]
    return max(errs, default=0.0)


def send(tape, nodes, seeds) -> dict:
    """What a run of nodes sends to the tensors entering it from `seeds` at its outputs."""
    if not nodes or not seeds:
        return {} if nodes else dict(seeds)  # no node of B: it hands the value on (an identity it dropped)
    where = {i: k for k, i in enumerate(tape.order)}
    grads = reverse(tape, sorted(nodes, key=lambda i: where.get(i, i)), seeds)
    return {n: g for n, g in grads.items() if n not in seeds}


def or_zeros(value, like):
    """A gradient one side does not send (an op without a rule, a zero path) is zero there."""
    if value is None and isinstance(like, torch.Tensor):
        return torch.zeros_like(like)
    return value
