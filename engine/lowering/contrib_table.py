"""The table of contrib-op expansions: each family module registers into it (contrib.py, contrib_attention.py,
contrib_fused.py), and expand_contrib and the op records read it."""
from __future__ import annotations

from typing import Callable

from onnx import NodeProto

from .context import Ctx

MS = "com.microsoft"

EXPANSIONS: dict[str, Callable[[Ctx, NodeProto], None]] = {}
# Contrib ops with no expansion -> why (their records say it; lowering stops at them naming the node).
NOT_EXPANDED: dict[str, str] = {}


def expansion(*ops: str):
    def register(fn):
        for op in ops:
            EXPANSIONS[op] = fn
        return fn

    return register


def not_expanded(why: str, *ops: str) -> None:
    for op in ops:
        NOT_EXPANDED[op] = why


def final(ctx: Ctx, node: NodeProto, value: str, k: int = 0) -> None:
    """Write `value` under the node's own k-th output name, so selections naming it still resolve."""
    ctx.emit("Identity", [value], [node.output[k]])
