"""Callback chains, including a callback that answers after the backward (an all-reduce).

A chain is a name's callbacks in attach order; each gets what the previous one returned. A
`StreamingCallback` in the chain splits it: the callbacks before it run as soon as autograd
produces the name's gradient (inside the backward, so a bucket can be sent while the rest of the
backward still runs, as torch's DistributedDataParallel does); it answers with a `Deferred`; once
the backward is over the manager calls its `end()` and runs the rest of the chain on
`Deferred.wait()`. So callbacks attached before it see the local gradient and those after it
the reduced one, the order seed 003 gives.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Protocol, Sequence

import torch

from ..errors import OnnxGradError, SelectionError

Callback = Callable[[str, torch.Tensor], torch.Tensor]


class Deferred(Protocol):
    def wait(self) -> torch.Tensor:
        """The value, available once the callback that returned this has ended its backward."""


class StreamingCallback:
    """A callback `(name, grad) -> Deferred` that takes part in a whole backward: `begin` before
    autograd runs (with every name whose chain holds it, in attach order), one call per gradient
    as autograd produces it, `end` after autograd has finished, `abort` when the backward failed."""

    def begin(self, manager, names: list[str]) -> None:
        raise NotImplementedError

    def __call__(self, name: str, grad: torch.Tensor) -> Deferred:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Forget the backward in progress."""


def check_chain(name: str, chain: Sequence[Callback], is_param: bool) -> None:
    """A chain may hold one streaming callback, and only on a parameter (its shape never changes)."""
    streaming = [cb for cb in chain if isinstance(cb, StreamingCallback)]
    if streaming and not is_param:
        raise SelectionError(f"{name!r} is not a parameter: a {type(streaming[0]).__name__} reduces "
                             "parameters' gradients, whose shapes are the same on every process")
    if len(streaming) > 1:
        raise OnnxGradError(f"{name!r} would go through {len(streaming)} streaming callbacks (all-reduces); "
                            "attach it with one")


def apply(name: str, grad: torch.Tensor, chain: Sequence[Callback]) -> torch.Tensor:
    """Run `chain` on `grad`, checking that every callback returns a tensor of the same shape."""
    for cb in chain:
        grad = _checked(cb, name, grad, cb(name, grad))
    return grad


def _checked(cb: Callback, name: str, grad: torch.Tensor, out) -> torch.Tensor:
    shape = tuple(grad.shape)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise OnnxGradError(f"callback {getattr(cb, '__name__', cb)!r} for {name!r} returned {got}; "
                            f"it must return a tensor of shape {shape}")
    return out


class Streams:
    """The chains of one backward that hold a streaming callback, run around autograd."""

    def __init__(self, manager, attached: dict[str, tuple[Callback, ...]]):
        self.chains = {n: chain for n, chain in attached.items()
                       if any(isinstance(cb, StreamingCallback) for cb in chain)}
        self.callbacks: list[StreamingCallback] = []
        for chain in self.chains.values():
            self.callbacks += [cb for cb in chain if isinstance(cb, StreamingCallback) and cb not in self.callbacks]
        self._paused: dict[str, tuple[StreamingCallback, Deferred, int, torch.Tensor]] = {}
        # Per name: the callbacks before its streaming one, and where that one sits.
        self._split = {n: next(i for i, cb in enumerate(chain) if isinstance(cb, StreamingCallback))
                       for n, chain in self.chains.items()}
        self.params = manager.params
        try:
            for cb in self.callbacks:
                cb.begin(manager, [n for n, chain in self.chains.items() if cb in chain])
        except BaseException:
            self.abort()
            raise

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Hooks that run each chain up to its streaming callback as autograd produces the gradient."""
        handles = [self.params[n].register_hook(lambda g, n=n: self._arrived(n, g)) for n in self.chains]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _arrived(self, name: str, grad: torch.Tensor) -> None:
        chain, k = self.chains[name], self._split[name]
        if k:
            grad = apply(name, grad, chain[:k])
        self._paused[name] = (chain[k], chain[k](name, grad), k + 1, grad)

    def finish(self) -> dict[str, torch.Tensor]:
        """End every streaming callback, then run the rest of each chain on its answer."""
        for cb in self.callbacks:
            cb.end()
        results = {}
        for name, chain in self.chains.items():
            if name in self._paused:
                cb, deferred, rest, local = self._paused[name]
                results[name] = apply(name, _checked(cb, name, local, deferred.wait()), chain[rest:])
        return results

    def abort(self) -> None:
        for cb in self.callbacks:
            cb.abort()
