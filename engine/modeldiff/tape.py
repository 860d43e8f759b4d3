"""One side of a diff run node by node: every node's inputs become its own autograd leaves, so each
node's forward value and its vector-Jacobian product can be read alone (the stepping API of
docs/python-api.md, "stepping the reverse pass yourself"). `replace` lets a run take another model's
values at the inputs of each node: that run is the other model's nodes replayed on this side's values."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from ..run.plan import StepObserver


@dataclass
class Record:
    leaves: dict[str, torch.Tensor]  # the node's float inputs, as its own leaves
    inputs: list[str | None]
    outputs: list[str | None]
    outs: list  # as computed from the leaves (attached to them)
    call: tuple = ()  # (fn, args as read (leaves in place, constants uncast), kwargs): run it again in another dtype


@dataclass
class Tape(StepObserver):
    replace: Callable[[str, torch.Tensor], torch.Tensor | None] | None = None
    records: dict[int, Record] = field(default_factory=dict)
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    graph: object = None  # the model's GraphIndex, for node names
    # the inputs that get their own leaves (the tensors a gradient flows into); None: every float input.
    # A weight outside it costs no weight gradient (the model's size again) and a node with no leaf no record.
    wanted: frozenset | None = None
    keep: Callable[[str], bool] | None = None  # which values `values` keeps (None: all)
    seen: Callable[[str, torch.Tensor], None] | None = None  # each value as it appears (streamed measures)
    done: Callable[[int], None] | None = None  # after each node ran and was recorded
    _met: set = field(default_factory=set)

    def _store(self, name, value):
        if self.seen is not None and isinstance(value, torch.Tensor):
            self.seen(name, value)
        if self.keep is None or self.keep(name):
            self.values[name] = value

    def source(self, name, value):
        self._met.add(name)
        self._store(name, value.detach() if isinstance(value, torch.Tensor) else value)
        return value

    def arguments(self, step, names, args):
        if self.replace is not None:
            args = [a if n is None or not isinstance(a, torch.Tensor) else _or(self.replace(n, a), a)
                    for n, a in zip(names, args)]
        wanted = self.wanted
        self._leaves = {n: a.detach().requires_grad_() for n, a in zip(names, args)
                        if n is not None and isinstance(a, torch.Tensor) and a.is_floating_point()
                        and (wanted is None or n in wanted)}
        for n, a in zip(names, args):
            if n is not None and n not in self._met and isinstance(a, torch.Tensor):
                self._met.add(n)
                self._store(n, a.detach())  # initializers: read from the plan, never a source
        self._args = [self._leaves.get(n, a) for n, a in zip(names, args)]
        self._names = names
        return self._args

    def outputs(self, step, args, names, outs):
        if self._leaves:
            self.records[step.node_index] = Record(self._leaves, list(self._names), list(names), list(outs),
                                                   (step.fn, self._args, step.kwargs))
        self.order.append(step.node_index)
        detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
        for n, o in zip(names, detached):
            if n is not None:
                self._met.add(n)
                self._store(n, o)
        if self.done is not None:
            self.done(step.node_index)
        return detached


def _or(value, fallback):
    return fallback if value is None else value


def run_tape(model, feeds: Mapping[str, object], targets: Iterable[str], *, dtype=None, device="cpu",
             replace=None, wanted=None, tape: Tape | None = None) -> Tape:
    """Run `model` from `feeds` to `targets`, node by node, recording each node on its own leaves (those
    of its inputs in `wanted`, when given: none at all for a forward-only comparison). A `tape` that
    keeps only some values (`keep`) streams: the run drops every other value after its last reader."""
    from ..dtypes import parse_device, parse_float_dtype

    dev, fdt = parse_device(device), parse_float_dtype(dtype)
    stream = tape is not None and tape.keep is not None
    plan = model.prepare(list(feeds), list(targets), device=dev, dtype=fdt, keep_all=not stream)
    values = [model.to_tensor(n, feeds[n], dev, fdt) for n in plan.sources]
    tape = tape if tape is not None else Tape()
    tape.replace, tape.wanted, tape.graph = replace, None if wanted is None else frozenset(wanted), model.graph
    with torch.enable_grad() if wanted is None or wanted else torch.no_grad():
        plan.run_observed(values, tape, free=stream)
    return tape


def vjp(record: Record, cotangents: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What `record`'s node sends to each float input from `cotangents` at its outputs (cast to the
    outputs' dtypes): one vector-Jacobian product."""
    return _pull(record.outputs, record.outs, record.leaves, cotangents, retain=True)


def _pull(names, outs, leaves: dict, cotangents: Mapping[str, torch.Tensor], retain: bool) -> dict[str, torch.Tensor]:
    pairs = [(o, cotangents[t].to(o.dtype)) for t, o in zip(names, outs)
             if t in cotangents and isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs or not leaves:
        return {}
    with torch.enable_grad():
        sent = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs],
                                   allow_unused=True, retain_graph=retain)
    return {n: g for n, g in zip(leaves, sent) if g is not None}


def reverse(tape: Tape, nodes: Iterable[int], seeds: Mapping[str, torch.Tensor],
            sent_by: dict[int, dict[str, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """The cotangent of every tensor from `seeds`, walking `nodes` (topological) backwards; what each
    node sent is kept in `sent_by` when given."""
    grads = dict(seeds)
    for i in reversed(list(nodes)):
        record = tape.records.get(i)
        if record is None:
            continue
        sent = vjp(record, grads)
        if sent_by is not None:
            sent_by[i] = sent
        for name, g in sent.items():
            grads[name] = grads[name] + g.to(grads[name].dtype) if name in grads else g
    return grads


def vjp_in(record: Record, cotangents: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`vjp`, with the node run again from its inputs cast to `dtype` (float64: the same node's value
    without its own rounding). {} where it cannot run so."""
    fn, args, kwargs = record.call
    leaves = {}
    cast = []
    for n, a in zip(record.inputs, args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach().to(dtype)
            if n in record.leaves:
                a = leaves[n] = a.requires_grad_()
        cast.append(a)
    try:
        with torch.enable_grad():
            out = fn(*cast, **kwargs)
    except Exception:  # noqa: BLE001 - a kernel without this dtype: no estimate, the strict tolerance stands
        return {}
    outs = [out[0] if isinstance(out, tuple) else out] if len(record.outputs) == 1 else list(out)
    return _pull(record.outputs, outs, leaves, cotangents, retain=False)
