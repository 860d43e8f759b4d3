"""The forward-mode (JVP) rules: one per op type, each registered right under its definition.

A rule is `rule(ctx, node, tangents) -> output tangents`: `tangents` holds one tangent tensor name per
input of `node` (None where that input carries none: a constant, an index, a z), and the rule returns
one name per output (None for a zero tangent), each shaped and typed exactly like its output, adding
the ONNX nodes that compute it through `ctx`. J·v is linear in the tangents, so a rule only ever
multiplies them by values of the forward pass. A rule returns NotImplemented for a case it does not
write (a tangent on an input it does not expect): then the node goes through the transposed backward
rule (engine/lowering/jvp/core.py), which is exact for every op that has one.
"""
from __future__ import annotations

from typing import Callable

from ..registry import registering

FORWARD: dict[str, Callable] = {}


def jvp_rule(*op_types: str):
    return registering(FORWARD, op_types)
