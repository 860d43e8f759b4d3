"""The first backward's check that every rank trains the same thing, naming what differs.

Each rank describes its model (nodes, parameters), its attach set through the all-reduce, the
reduction and its parameters' values as ordered (kind, key, value) entries; ranks exchange a
digest of them (one small all_gather) and only when digests differ the entries themselves, so
the error can say what differs and where.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .group import finish, translated, where

# What is reported first when several things differ: a different model explains different attaches.
KINDS = ("node", "parameter", "attached", "reduce", "value")
Entry = tuple[str, str, str]


def describe(manager, names: list[str], op: str) -> list[Entry]:
    graph = manager.model.graph
    entries = [("node", str(i), f"{n.op_type}({', '.join(n.input)}) -> {', '.join(n.output)}")
               for i, n in enumerate(graph.nodes)]
    entries += [("parameter", n, f"{tuple(p.shape)} {str(p.dtype).removeprefix('torch.')}")
                for n, p in manager.params.items()]
    entries += [("attached", n, "") for n in names]
    entries.append(("reduce", "", op))
    entries += [("value", n, _value_digest(p)) for n, p in manager.params.items()]
    return entries


def _value_digest(t: torch.Tensor) -> str:
    data = t.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest()


def agree(entries: list[Entry], group, timeout: float | None) -> None:
    """Raise a DistributedError on every rank, naming the first difference, unless all ranks agree."""
    digest = hashlib.sha256(repr(entries).encode()).digest()
    # NCCL moves only CUDA tensors (each rank's own GPU); gloo moves CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    mine = torch.tensor(list(digest), dtype=torch.int64, device=device)
    size = dist.get_world_size(group)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    what = f"{where(group)}: comparing the ranks' models at the first backward failed"
    with translated(what, timeout):
        finish(dist.all_gather(gathered, mine, group=group, async_op=True), timeout)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    everyone: list = [None] * size
    with translated(what, timeout):
        dist.all_gather_object(everyone, entries, group=group)
    other = next(r for r in range(size) if everyone[r] != everyone[0])
    raise DistributedError(f"{where(group)}: ranks disagree at the first backward: "
                           f"{difference(everyone[0], everyone[other], other)}")


def difference(first: list[Entry], other: list[Entry], r: int) -> str:
    """The first thing (in KINDS order) that rank `r` has differently from rank 0, in words."""
    for kind in KINDS:
        a = {key: value for k, key, value in first if k == kind}
        b = {key: value for k, key, value in other if k == kind}
        for key in [*a, *(k for k in b if k not in a)]:
            if a.get(key) != b.get(key):
                return _say(kind, key, a.get(key), b.get(key), r)
    return f"rank {r} differs from rank 0"


def _say(kind: str, key: str, a: str | None, b: str | None, r: int) -> str:
    if kind == "node":
        return (f"the model differs: node {key} is {a or 'absent'} on rank 0 "
                f"but {b or 'absent'} on rank {r}")
    if kind == "parameter":
        return (f"the model differs: parameter {key!r} is {a or 'absent'} on rank 0 "
                f"but {b or 'absent'} on rank {r}")
    if kind == "attached":
        on, off = (0, r) if a is not None else (r, 0)
        return f"the attach set differs: {key!r} goes through the all-reduce on rank {on} but not on rank {off}"
    if kind == "reduce":
        return f"the all-reduce is {a} on rank 0 but {b} on rank {r}"
    return (f"parameter {key!r} has other values on rank {r} than on rank 0: call "
            "engine.distributed.broadcast_params(gm) once after building the manager")
