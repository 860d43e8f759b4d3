"""The backward rules: one per op type, each registered right under its definition.

A rule is `rule(ctx, node, grads) -> input grads`: `grads` holds one gradient tensor name per
output of `node` (None where no gradient flows into that output), and the rule returns one name
per input (None for no gradient), adding the ONNX nodes that compute them through `ctx`.
`ctx.wants(i)` says whether input i needs its gradient at all, so rules skip work nobody reads.
"""
from __future__ import annotations

from typing import Callable

BACKWARD: dict[str, Callable] = {}
REFUSED: dict[str, str] = {}  # op type -> why it is not lowered (one line, listed in docs/lowering.md)


def rule(*op_types: str):
    def register(fn: Callable) -> Callable:
        for op in op_types:
            BACKWARD[op] = fn
        return fn

    return register


def refuse(why: str, *op_types: str) -> None:
    """Ops whose backward is not lowered, with the reason a user reads."""
    for op in op_types:
        REFUSED[op] = why
