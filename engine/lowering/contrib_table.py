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
    """Write `value` under the node's own k-th output name, so selections naming it still resolve (nothing when
    the node leaves that optional output out)."""
    if k < len(node.output) and node.output[k]:
        ctx.emit("Identity", [value], [node.output[k]])


def padded_inputs(node: NodeProto) -> list[str]:
    """The node's input names, "" for every optional one it leaves out (so any schema position can be read)."""
    return list(node.input) + [""] * 17


def plus(ctx: Ctx, x: str, bias: str) -> str:
    return ctx.op("Add", [x, bias]) if bias else x


def cast(ctx: Ctx, t: str, elem: int, known: int | None = None) -> str:
    """t in `elem` (t's type is `known`, or looked up: a tensor built here is typed only afterwards)."""
    return t if not t or (known or ctx.elem(t)) == elem else ctx.op("Cast", [t], to=elem)
