"""Joining a torch.distributed process group, starting ranks equal, and one-line errors from collectives.

The transport is torch.distributed's (gloo on CPU, NCCL on CUDA); this module only chooses the
backend, bounds every wait, and turns the backends' multi-line failures into a DistributedError.
"""
from __future__ import annotations

import atexit
import datetime
import os
import re
import time
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from ..errors import DistributedError, OnnxGradError

DEFAULT_TIMEOUT = 300.0
_timeout = {"seconds": None}  # set by init(): what the process group was created with


def active(group=None) -> bool:
    """Whether there is a process group to talk to (else this process is a world of one)."""
    return group is not None or (dist.is_available() and dist.is_initialized())


def rank(group=None) -> int:
    return dist.get_rank(group) if active(group) else 0


def world_size(group=None) -> int:
    return dist.get_world_size(group) if active(group) else 1


def default_timeout() -> float | None:
    """The timeout init() gave the process group, in seconds (None: a group made elsewhere)."""
    return _timeout["seconds"]


def init(device: str | torch.device = "cpu", *, timeout: float = DEFAULT_TIMEOUT, init_method: str | None = None,
         backend: str | None = None) -> torch.device:
    """Join the process group that torchrun (or RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) describes.

    gloo for CPU, NCCL for CUDA (each rank on the GPU its LOCAL_RANK names). Without WORLD_SIZE
    (a plain `python script.py`) nothing is joined: the process is a world of one and the
    all-reduce callback passes gradients through. `timeout` (seconds) bounds the wait for the
    other ranks to join and every collective after it. Returns the device this rank trains on."""
    device = torch.device(device)
    if init_method is None and "WORLD_SIZE" not in os.environ:
        return device
    if not dist.is_available():
        raise OnnxGradError("this torch build has no torch.distributed: data-parallel training needs it")
    if dist.is_initialized():
        raise OnnxGradError("a torch.distributed process group already exists: call engine.distributed.init() "
                            "once per process")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kwargs = {}
    if init_method is not None:  # a file:// or tcp:// rendezvous: the rank and size come from the environment
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise OnnxGradError(f"init_method {init_method!r} needs RANK and WORLD_SIZE in the environment")
        kwargs = dict(init_method=init_method, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    who = f"rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')}"
    with translated(f"{who}: the process group did not form", timeout, "not every rank joined within"):
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **kwargs)
    atexit.register(abandon)  # whatever ends the process: see abandon
    _timeout["seconds"] = timeout
    return device


def broadcast_params(params, src: int = 0, group=None, timeout: float | None = None) -> None:
    """Copy rank `src`'s parameters to every rank: one broadcast per dtype, in place. Call it once
    after building the GradManager (`params`: the manager or its `params`). No group: nothing to do."""
    params = getattr(params, "params", params)
    if not active(group):
        return
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in params.values():
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for tensors in by_kind.values():
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        with translated(f"{where(group)}: broadcasting the parameters from rank {src} failed", timeout):
            finish(dist.broadcast(flat, src, group=group, async_op=True), timeout)
        with torch.no_grad():
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


def where(group=None) -> str:
    return f"rank {rank(group)} of {world_size(group)}"


def finish(work, timeout: float | None) -> None:
    """Wait for an async collective, no longer than `timeout` seconds (None: the group's own)."""
    timeout = default_timeout() if timeout is None else timeout
    if timeout is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout))


@contextmanager
def translated(what: str, timeout: float | None,
               cause: str = "another rank died, left or did not answer within") -> Iterator[None]:
    """Turn a backend failure (a dead peer, a timeout) into a one-line DistributedError."""
    start = time.monotonic()
    try:
        yield
    except RuntimeError as exc:  # gloo, NCCL and the store all raise RuntimeError subclasses
        timeout = default_timeout() if timeout is None else timeout
        limit = f"{timeout:g} s" if timeout is not None else "the process group's timeout"
        message = f"{what} after {time.monotonic() - start:.1f} s: {cause} {limit} ({backend_reason(exc)})"
        abandon()
        raise DistributedError(message) from None


def abandon() -> None:
    """Destroy the default group, after a collective failed (it cannot be used again) and at exit.
    Its transport threads, left to the interpreter's finalization, made gloo call std::terminate
    there now and then: a rank that had printed its one-line error (a dead peer, ranks that
    disagree) ended with SIGABRT instead of its exit code."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except (RuntimeError, ValueError):
        pass


def backend_reason(exc: BaseException) -> str:
    """The first sentence of a backend's message, without its source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    text = re.split(r"\.\s+(?=[A-Z])", text)[0]
    return text.rstrip(".!") or type(exc).__name__
