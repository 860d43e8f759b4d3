"""Everything a check needs about one (model, y, xs, zs, values): plans, float64 values, dy, gradients."""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch

from ..dtypes import parse_device
from ..errors import SelectionError
from ..gradient.prepared import PreparedGradient, float_y, seed_for
from ..gradient.selection import GradientSpec, names
from ..model import Model
from ..run.plan import Plan
from .point import ForwardStats, forward_stats
from .structure import RowSplit, separable_terms, trailing_tail

F64 = torch.float64


@dataclass
class Context:
    model: Model
    spec: GradientSpec
    device: torch.device
    sources: tuple[str, ...]  # spec.inputs + extra fed initializers, the plans' source order
    feeds: dict
    values: dict[str, np.ndarray]  # xs ∪ zs as used
    tensors64: list[torch.Tensor]
    plan64: Plan
    y0: torch.Tensor
    dy: torch.Tensor
    dy_label: str
    grads64: dict[str, torch.Tensor]
    disconnected: frozenset[str]
    # What later checks of the same (model, selection, device) can reuse: per x, the frontier, the
    # batching strategy that worked and whether rows mix (see xcheck.XProbe). Structure, not values.
    memo: dict = dataclasses.field(default_factory=dict)
    gradient: PreparedGradient | None = None  # what computed grads64
    _all_values: dict | None = None
    _stats: ForwardStats | None = None
    _kept: dict = dataclasses.field(default_factory=dict)  # values computed by `values_of`, by name

    # y0 comes from the gradient's own forward; the forward that keeps every value runs only for
    # what needs them all (per-node checks, the NaN search): sizes, magnitudes and a frontier's
    # values come from forwards that keep nothing else (point.py).
    @property
    def keep_plan(self) -> Plan:
        """The y <- sources slice keeping every value (per-node checks, NaN search)."""
        return self.model.prepare(self.sources, [self.spec.y], device=self.device, dtype=F64, keep_all=True)

    @property
    def all_values(self) -> dict[str, torch.Tensor]:
        """Every value of the slice at the point, float64."""
        if self._all_values is None:
            with torch.no_grad():
                self._all_values = self.keep_plan.run_all(self.tensors64)
        return self._all_values

    def analytic_roundoff(self) -> dict[str, torch.Tensor] | None:
        """Per x, a sample of each element's rounding error in grads64, or None where the backward
        is not linear in dy (a wrong VJP, or nondeterministic kernels).

        A gradient that is exactly zero (a softmax seeded so that its VJP cancels, a y that does
        not move) comes out as pure roundoff, which finite differences resolving exact zeros would
        call wrong. Seeding with 3 * dy rounds differently and gives a second sample of that error;
        seeding with 2 * dy must reproduce the gradient bit for bit (scaling by a power of two is
        exact), which a VJP that is not linear in dy cannot fake.
        """
        if self.gradient is None:
            return None
        doubled, tripled = (self.gradient(*self.tensors64, dy=k * self.dy).grads for k in (2.0, 3.0))
        out = {}
        for name, g, g2, g3 in zip(self.spec.xs, (self.grads64[n] for n in self.spec.xs), doubled, tripled):
            if not torch.equal(g2.detach() / 2, g):
                return None
            out[name] = (g - g3.detach() / 3).abs()
        return out

    def y_again(self) -> torch.Tensor:
        """y from a second forward run, for the determinism check."""
        with torch.no_grad():
            return self.plan64.run(self.tensors64)[0]

    def bytes_per_forward(self) -> int:
        """Bytes of values one forward of the slice holds (a property of the graph and the shapes)."""
        key = ("bytes per forward", tuple(tuple(t.shape) for t in self.tensors64))
        if key not in self.memo:
            self.memo[key] = self.stats.bytes
        return self.memo[key]

    @property
    def stats(self) -> ForwardStats:
        if self._stats is None:
            self._stats = forward_stats(self.plan64, self.tensors64)
        return self._stats

    def values_of(self, wanted) -> list[torch.Tensor]:
        """The float64 values of `wanted` at the point, from one forward that keeps only them."""
        if self._all_values is not None:
            return [self._all_values[n] for n in wanted]
        missing = [n for n in dict.fromkeys(wanted) if n not in self._kept and n not in self.sources]
        if missing:
            plan = self.model.prepare(self.sources, missing, device=self.device, dtype=F64)
            with torch.no_grad():
                # unfused, as the keep-all forward ran: the fused attention rounds differently
                self._kept.update(zip(missing, plan.run(self.tensors64, fused=False)))
        return [self.tensors64[self.sources.index(n)] if n in self.sources else self._kept[n] for n in wanted]

    def x_memo(self, name: str, shape) -> dict:
        return self.memo.setdefault((name, tuple(shape), tuple(self.y0.shape)), {})

    def x_function(self, name: str, target: str | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
        """y (or `target`, a value on the way to y) as a function of one x, everything else held at
        its value (float64).

        Only the nodes downstream of x run: every other value they read is fed from the point's
        values, so perturbing a late layer's weight does not re-run the early layers.
        """
        memo = self.memo.setdefault((name, "frontier"), {})
        if "frontier" not in memo:
            memo["frontier"] = self.frontier(name)
        frontier = memo["frontier"]
        plan = self.model.prepare((name,) + frontier, [target or self.spec.y], device=self.device, dtype=F64)
        fixed = self.values_of(frontier)

        def f(x: torch.Tensor) -> torch.Tensor:
            return plan.run([x] + fixed)[0]

        return f

    def row_split(self, name: str) -> RowSplit | None:
        """<dy, y> as <w, p(x)> + c, p the value before y's trailing affine ops (see structure.py)."""
        memo = self.memo.setdefault((name, "frontier"), {})
        if "tail" not in memo:
            memo["tail"] = trailing_tail(self.keep_plan, self.spec.y, name)
        tail = memo["tail"]
        if tail is None:
            return None
        grad = self._tail_gradient(tail.value)
        if tail.reduction is None:
            fn = self.x_function(name, tail.value)
        else:
            names = [None if s is None else self.keep_plan.names[s] for s in tail.reduction.in_slots]
            first, *others = self.values_of([n for n in names if n is not None])
            others = [None if n is None else others.pop(0) for n in names[1:]]
            found = separable_terms(tail.reduction, self.x_function(name, names[0]), others, first)
            if found is None:
                return None
            fn, factor = found
            grad = grad.reshape(()) * factor
        with torch.no_grad():
            p0 = fn(self.tensors64[self.sources.index(name)])
        return RowSplit(fn, p0, grad.expand_as(p0).contiguous())

    def _tail_gradient(self, value: str) -> torch.Tensor:
        """d<dy, y>/d`value`, through the nodes between them (affine: any point gives the same)."""
        if value == self.spec.y:
            return self.dy
        frontier = self.frontier(value)
        plan = self.model.prepare((value,) + frontier, [self.spec.y], device=self.device, dtype=F64)
        start, *fixed = self.values_of((value,) + frontier)
        leaf = start.detach().clone().requires_grad_()
        with torch.enable_grad():
            out = plan.run([leaf] + fixed)[0]
            grad = torch.autograd.grad(out, leaf, self.dy, allow_unused=True)[0] if out.requires_grad else None
        return torch.zeros_like(leaf) if grad is None else grad.detach()

    def frontier(self, name: str) -> tuple[str, ...]:
        """Values read by the nodes downstream of `name` that do not themselves depend on it."""
        down, reads = self._downstream(name)
        constants = self.model.graph.initializers
        return tuple(n for n in reads if n not in down and (n not in constants or n in self.sources))

    def _downstream(self, name: str) -> tuple[set, dict]:
        """(the values that depend on `name`, itself included; every value their nodes read)"""
        plan = self.keep_plan
        down, reads = {name}, {}
        for step in plan.steps:
            ins = [plan.names[s] for s in step.in_slots if s is not None]
            if down.intersection(ins):
                down.update(plan.names[s] for s in step.out_slots if s is not None)
                reads.update(dict.fromkeys(ins))
        return down, reads

    def downstream_magnitude(self, name: str) -> float:
        """The largest finite |value| that depends on `name` at the point (y included): steps far
        below its ulp may be rounded away before they reach y (see verify/absorbed.py)."""
        memo = self.memo.setdefault((name, "frontier"), {})
        if "down" not in memo:
            memo["down"] = tuple(self._downstream(name)[0])
        magnitudes = self.stats.largest
        return max((magnitudes[n] for n in memo["down"] if n in magnitudes), default=0.0)

    def native_tensors(self) -> list[torch.Tensor]:
        return [self.model.to_tensor(n, self._value(n), self.device, None) for n in self.sources]

    def _value(self, name: str):
        return self.values[name] if name in self.values else self.feeds[name]


# Validated selections and their prepared gradients, per model: validating walks the graph, and a
# small model's whole check costs a few milliseconds, so repeated checks reuse them.
_PREPARED: "weakref.WeakKeyDictionary[Model, dict]" = weakref.WeakKeyDictionary()


def _prepared(model: Model, y, xs, zs, dev, extras_of):
    key = (y, names(xs), names(zs), str(dev))
    cache = _PREPARED.setdefault(model, {})
    if key not in cache:
        spec = model.selection(y, xs, zs)
        cache[key] = (spec, {})
    spec, by_extras = cache[key]
    extras = extras_of(spec)
    if extras not in by_extras:
        by_extras[extras] = (model.prepare_gradient(spec.y, spec.xs, spec.zs, device=dev, dtype=F64,
                                                    extra_inputs=extras), {})
    prepared, memo = by_extras[extras]
    return spec, extras, prepared, memo


def build(model: Model, y: str, xs, zs, feeds: Mapping | None, dy, seed: int, device, ones_dy: bool,
          dims: Mapping[str, int] | None = None) -> Context:
    dev = parse_device(device)
    feeds = dict(feeds or {})
    model.check_feed_names(feeds)

    def extras_of(spec):
        # Fed initializers the cut graph reads (and a refusal of feeds inside it); none without other feeds.
        return tuple(model.gradient_extras(spec, feeds)) if set(feeds) - set(spec.inputs) else ()

    spec, extras, prepared, memo = _prepared(model, y, xs, zs, dev, extras_of)
    values = model.selection_values(spec, feeds, seed=seed, dims=dims)
    sources = tuple(spec.inputs) + tuple(extras)
    tensors64 = [model.to_tensor(n, values[n] if n in values else feeds[n], dev, F64) for n in sources]
    plan64 = model.prepare(sources, [spec.y], device=dev, dtype=F64)
    seeded = {}

    def seed_of(y0: torch.Tensor) -> torch.Tensor:  # dy's shape is y's: known once the forward ran
        if not isinstance(y0, torch.Tensor):
            raise SelectionError(f"y {spec.y!r} is not a float tensor: gradients need a float y")
        float_y(y0, repr(spec.y))
        seeded["dy"], seeded["label"] = _seed(y0, dy, seed, ones_dy, spec.y, memo)
        return seeded["dy"]

    out = prepared(*tensors64, dy=seed_of)
    grads = {n: g.detach() for n, g in zip(spec.xs, out.grads)}
    return Context(model, spec, dev, sources, feeds, values, tensors64, plan64, out.y.detach(), seeded["dy"],
                   seeded["label"], grads, out.disconnected, memo, prepared)


def _seed(y0: torch.Tensor, dy, seed: int, ones: bool, y_name: str, memo: dict) -> tuple[torch.Tensor, str]:
    """The upstream gradient: given; ones for a scalar y or a claimed-gradient check; else seeded random."""
    if dy is not None:
        t = dy if isinstance(dy, torch.Tensor) else torch.as_tensor(np.asarray(dy))
        if tuple(t.shape) != tuple(y0.shape) and t.numel() == y0.numel():  # a flat dy of y's size is y's
            t = t.reshape(y0.shape)
        return seed_for(y0, t, y_name), "given"
    if y0.numel() == 1:
        return torch.ones_like(y0), "scalar"
    if ones:
        return torch.ones_like(y0), "ones"
    # Drawing costs more than a small model's forward: the last draw is kept (read-only) for the
    # next check of the selection.
    key = (seed, tuple(y0.shape), y0.device)
    last = memo.get("random dy")
    if last is None or last[0] != key:
        from .fd import keep_draw, normal

        last = keep_draw(memo, "random dy", (key, normal(y0.shape, seed, y0)))
    return last[1], f"random:{seed}"
