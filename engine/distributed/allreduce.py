"""MegEngine's `make_allreduce_cb` for GradManager, on torch.distributed, with DDP's gradient buckets.

The attached parameters are cut into buckets of about `bucket_mb` MB (the first one 1 MB, so
that sending starts early), taken in reverse attach
order (the order a backward produces gradients), one dtype and device per bucket. During the
backward each gradient is copied into its bucket as soon as autograd produces it; a bucket whose
gradients are all in is all-reduced at once (asynchronously, in bucket order on every rank, so
the ranks' collectives always pair up), while autograd goes on with the layers before it. After
the backward, the buckets not yet sent go out and every one is waited for.

Each bucket carries one count per gradient, how many ranks produced it, so that a gradient that
some ranks produce and others do not is an error on every rank rather than a silent divergence.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DistributedError, OnnxGradError
from ..gradmanager.chains import StreamingCallback
from .agreement import agree, describe
from .group import active, finish, translated, where

OPS = ("MEAN", "SUM")
FIRST_BUCKET_BYTES = 2 ** 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES, which DDP uses


@dataclass(frozen=True)
class BucketPlan:
    """Which gradients share one collective, and where each sits in the flat buffer."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int
    dtype: torch.dtype
    device: torch.device

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class BackwardStats:
    """What the last backward sent: buckets, how many left while autograd still ran, the bytes,
    and the seconds spent waiting for collectives after autograd finished."""

    buckets: int
    sent_during_backward: int
    nbytes: int
    wait_seconds: float


def plan_buckets(tensors: dict[str, torch.Tensor], cap_bytes: int,
                 first_cap_bytes: int | None = None) -> tuple[BucketPlan, ...]:
    """Buckets over `tensors` (attach order) filled in reverse order; a bucket closes once it
    holds `cap_bytes` or more, the first of each dtype once it holds `first_cap_bytes` (so the
    first collective starts early), as DistributedDataParallel's do."""
    first = cap_bytes if first_cap_bytes is None else min(first_cap_bytes, cap_bytes)
    open_: dict[tuple, list[str]] = {}
    closed: list[list[str]] = []
    started: set[tuple] = set()
    for name in reversed(list(tensors)):
        t = tensors[name]
        key = (t.dtype, t.device)
        members = open_.setdefault(key, [])
        members.append(name)
        limit = cap_bytes if key in started else first
        if sum(tensors[n].numel() for n in members) * t.dtype.itemsize >= limit:
            closed.append(open_.pop(key))
            started.add(key)
    order = {n: i for i, n in enumerate(reversed(list(tensors)))}
    closed += open_.values()
    closed.sort(key=lambda members: order[members[0]])
    plans = []
    for members in closed:
        shapes = tuple(tuple(tensors[n].shape) for n in members)
        offsets = tuple(sum(math.prod(s) for s in shapes[:i]) for i in range(len(shapes)))
        t = tensors[members[0]]
        plans.append(BucketPlan(tuple(members), shapes, offsets, sum(math.prod(s) for s in shapes), t.dtype, t.device))
    return tuple(plans)


class _Bucket:
    """One backward's buffer for a BucketPlan: the gradients, then one count per gradient (this
    rank's 0 or 1, written when the bucket is sent; after the all-reduce, how many ranks had it)."""

    def __init__(self, plan: BucketPlan, scale: int = 1):
        self.plan, self.scale = plan, scale
        self.flat = torch.empty(plan.numel + len(plan.names), dtype=plan.dtype, device=plan.device)
        self.spans = [(start, start + math.prod(shape), shape) for start, shape in zip(plan.offsets, plan.shapes)]
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * len(self.plan.names)
        self.missing = len(self.plan.names)
        self.work = None

    def unshared(self) -> bool:
        """Whether no tensor but `flat` holds the buffer any more (every gradient handed out from
        it is gone, e.g. an optimizer's zero_grad set them to None): then it can be filled again
        instead of allocating (and page-faulting) a new one, as DDP keeps its buckets."""
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        return use_count is not None and use_count(self.flat.untyped_storage()._cdata) <= 2  # flat + the wrapper

    def put(self, i: int, grad: torch.Tensor) -> None:
        start, end, shape = self.spans[i]
        place = self.flat[start:end].view(shape)  # copy_ and div read any strides: no reshape copy
        if self.scale == 1:
            place.copy_(grad)
        else:  # MEAN: divided on the way in, as DDP does, so the reduced sum is the mean (one pass, not two)
            torch.div(grad, self.scale, out=place)
        self.counts[i] = 1
        self.missing -= 1

    def seal(self) -> None:
        """Write the counts, and zeros where this rank produced no gradient: ready to send."""
        if self.missing == 0:
            self.flat[self.plan.numel:] = 1
            return
        for (start, end, _), count in zip(self.spans, self.counts):
            if not count:
                self.flat[start:end] = 0
        self.flat[self.plan.numel:] = torch.tensor(self.counts, dtype=self.flat.dtype)

    def value(self, i: int) -> torch.Tensor:
        start, end, shape = self.spans[i]
        return self.flat[start:end].view(shape)


class _Slot:
    """A gradient's place in a bucket: its reduced value once the callback's backward ended."""

    def __init__(self, bucket: _Bucket, i: int):
        self.bucket, self.i = bucket, i

    def wait(self) -> torch.Tensor:
        return self.bucket.value(self.i)


class _Ready:
    def __init__(self, grad: torch.Tensor):
        self.grad = grad

    def wait(self) -> torch.Tensor:
        return self.grad


class AllreduceCallback(StreamingCallback):
    """A GradManager callback that replaces each gradient by its sum or mean over the ranks."""

    def __init__(self, op: str = "MEAN", group=None, bucket_mb: float = 25.0, timeout: float | None = None):
        op = str(op).upper()
        if op not in OPS:
            raise OnnxGradError(f"all-reduce op {op!r} is not one of {', '.join(OPS)}")
        if not bucket_mb > 0:
            raise OnnxGradError(f"bucket_mb must be positive, not {bucket_mb!r}")
        self.op, self.group, self.bucket_mb, self.timeout = op, group, float(bucket_mb), timeout
        self.plans: tuple[BucketPlan, ...] = ()
        self.last_backward: BackwardStats | None = None
        self._agreed = None  # (params, names) checked with the other ranks
        self._buckets: list[_Bucket] | None = None
        self._spare: list[_Bucket] = []  # the last backward's, filled again once nothing holds them
        self._where: dict[str, tuple[int, int]] = {}
        self._labels: dict[int, str] = {}
        self._next = 0
        self._solo = False

    def __repr__(self) -> str:
        return f"<all-reduce {self.op}, buckets of {self.bucket_mb:g} MB>"

    @property
    def __name__(self) -> str:  # callback errors name callbacks by __name__
        return f"make_allreduce_cb({self.op!r})"

    def begin(self, manager, names: list[str]) -> None:
        self._solo = not active(self.group)
        if self._solo:
            self._buckets = []
            return
        if self._agreed is None or self._agreed[0] is not manager.params or self._agreed[1] != names:
            agree(describe(manager, names, self.op), self.group, self.timeout)
            self.plans = plan_buckets({n: manager.params[n] for n in names}, int(self.bucket_mb * 2 ** 20),
                                      FIRST_BUCKET_BYTES)
            self._where = {n: (b, i) for b, plan in enumerate(self.plans) for i, n in enumerate(plan.names)}
            self._labels = {id(p): _label(p, k, len(self.plans), self.group) for k, p in enumerate(self.plans)}
            self._agreed = (manager.params, list(names))
        scale = dist.get_world_size(self.group) if self.op == "MEAN" else 1
        spare = {id(b.plan): b for b in self._spare if b.scale == scale and b.unshared()}
        self._buckets = [spare.get(id(p)) or _Bucket(p, scale) for p in self.plans]
        for b in self._buckets:
            b.reset()
        self._next = 0

    def __call__(self, name: str, grad: torch.Tensor):
        if self._buckets is None:
            raise OnnxGradError(f"{self.__name__} runs inside GradManager.backward(): attach it, do not call it")
        if self._solo:
            return _Ready(grad)
        if grad.requires_grad:
            raise OnnxGradError(f"the all-reduce cannot carry {name!r}'s second-order graph to the other ranks; "
                                "take higher-order gradients without it")
        b, i = self._where[name]
        self._buckets[b].put(i, grad)
        self._send_ready()
        return _Slot(self._buckets[b], i)

    def _send_ready(self) -> None:
        while self._next < len(self._buckets) and self._buckets[self._next].missing == 0:
            self._send(self._buckets[self._next])
            self._next += 1

    def _send(self, bucket: _Bucket) -> None:
        bucket.seal()
        with translated(self._what(bucket), self.timeout):
            bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)

    def end(self) -> None:
        buckets, self._buckets = self._buckets, None
        if self._solo:
            return
        sent_early = self._next
        for bucket in buckets[self._next:]:
            self._send(bucket)
        start = time.monotonic()
        size = dist.get_world_size(self.group)
        for bucket in buckets:
            with translated(self._what(bucket), self.timeout):
                finish(bucket.work, self.timeout)
            self._check_counts(bucket, size)
        self._spare = buckets  # every collective on them is over
        self.last_backward = BackwardStats(len(buckets), sent_early, sum(b.plan.nbytes for b in buckets),
                                           time.monotonic() - start)

    def _check_counts(self, bucket: _Bucket, size: int) -> None:
        counts = bucket.flat[bucket.plan.numel:].tolist()
        for name, count in zip(bucket.plan.names, counts):
            if round(count) not in (0, size):
                raise DistributedError(f"{where(self.group)}: {name!r} got a gradient on {round(count)} of {size} "
                                       "ranks in this backward: every rank must differentiate the same y")

    def abort(self) -> None:
        self._buckets, self._spare = None, []  # a bucket may still be in flight: never fill it again

    def _what(self, bucket: _Bucket) -> str:
        return self._labels[id(bucket.plan)]


def _label(plan: BucketPlan, k: int, count: int, group) -> str:
    """How an error names bucket k: its rank, its place and its first gradients."""
    names = ", ".join(plan.names[:4]) + (", ..." if len(plan.names) > 4 else "")
    return f"{where(group)}: the all-reduce of bucket {k + 1}/{count} ({names}) failed"


def make_allreduce_cb(op: str = "MEAN", group=None, *, bucket_mb: float = 25.0,
                      timeout: float | None = None) -> AllreduceCallback:
    """A GradManager callback that all-reduces gradients over `group` (default: the whole world),
    as MegEngine's `dist.make_allreduce_cb`: `gm.attach(names, callbacks=make_allreduce_cb("MEAN"))`.

    `op`: "MEAN" (the usual, for a loss averaged over each rank's shard) or "SUM". Gradients go in
    buckets of about `bucket_mb` MB, each sent as soon as the backward has produced it. `timeout`
    (seconds) bounds each wait (default: the group's). Without a process group it passes
    gradients through unchanged."""
    return AllreduceCallback(op, group, bucket_mb, timeout)
