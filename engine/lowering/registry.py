"""The backward rules: one per op type, each registered right under its definition.

A rule is `rule(ctx, node, grads) -> input grads`: `grads` holds one gradient tensor name per
output of `node` (None where no gradient flows into that output), and the rule returns one name
per input (None for no gradient), adding the ONNX nodes that compute them through `ctx`.
`ctx.wants(i)` says whether input i needs its gradient at all, so rules skip work nobody reads.

`lowering_of(domain, op_type)` is how an op's record (`engine.registry.record(...).lowering`) finds
what is here: its rule, the expansion that writes it out first, its ONNX function body, or why not.
"""
from __future__ import annotations

from typing import Callable

from ..oprecord import Lowering

BACKWARD: dict[str, Callable] = {}
REFUSED: dict[str, str] = {}  # op type -> why it is not lowered (one line, listed in docs/lowering.md)
EXPANDED: dict[tuple[str, str], Callable] = {}  # (domain, op type) of a user's op -> its ai.onnx expansion
REWRITTEN: dict[str, str] = {}  # op type -> how lowering writes it as other ops before any rule runs


def rule(*op_types: str):
    return registering(BACKWARD, op_types)


def registering(table: dict, op_types) -> Callable:
    """A decorator that files its function in `table` under each op type (the backward and forward rules)."""
    def register(fn: Callable) -> Callable:
        for op in op_types:
            table[op] = fn
        return fn

    return register


def refuse(why: str, *op_types: str) -> None:
    """Ops whose backward is not lowered, with the reason a user reads."""
    for op in op_types:
        REFUSED[op] = why


def rewritten(how: str, *op_types: str) -> None:
    for op in op_types:
        REWRITTEN[op] = how


def expansion(op_type: str, *, domain: str):
    """Decorator for an op of your own domain (an --ops file): `fn(ctx, node)` writes the node out in
    ai.onnx ops before lowering, the last of them writing the node's own output names
    (`ctx.emit(op, inputs, list(node.output))`); their rules differentiate it, and the lowered model
    runs on any runtime."""

    def register(fn: Callable) -> Callable:
        EXPANDED[(domain, op_type)] = fn
        return fn

    return register


def lowering_of(domain: str, op_type: str) -> Lowering:
    """How `engine.lower` differentiates op_type of `domain` (a record's `lowering`)."""
    from ..modelfile.contrib_schema import DEFAULT_DOMAIN_OPS
    from . import contrib, training  # importing the package fills every table

    domain = "" if domain == "ai.onnx" else domain
    if not domain and op_type in BACKWARD:
        fn = BACKWARD[op_type]
        return Lowering("rule", f"{fn.__module__}.{fn.__name__}", fn)
    if not domain and op_type in REFUSED:
        return Lowering("refused", REFUSED[op_type])
    contrib_op = domain == contrib.MS or (not domain and op_type in DEFAULT_DOMAIN_OPS)
    if contrib_op and op_type in contrib.EXPANSIONS:
        fn = contrib.EXPANSIONS[op_type]
        return Lowering("expansion", f"{fn.__module__}.{fn.__name__}", fn)
    if contrib_op and op_type in contrib.NOT_EXPANDED:
        return Lowering("refused", contrib.NOT_EXPANDED[op_type])
    if domain == training.DOMAIN and op_type in training.OPTIMIZERS:
        fn = training.OPTIMIZERS[op_type]
        return Lowering("expansion", f"{fn.__module__}.{fn.__name__}", fn)
    if (domain, op_type) in EXPANDED:
        fn = EXPANDED[(domain, op_type)]
        return Lowering("expansion", f"{fn.__module__}.{fn.__name__}", fn)
    if not domain and op_type in REWRITTEN:
        return Lowering("expansion", REWRITTEN[op_type])
    if _has_function_body(domain, op_type):
        return Lowering("function body", "its ONNX schema's function body, differentiated op by op")
    return Lowering("missing")


def _has_function_body(domain: str, op_type: str) -> bool:
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, domain)
    except onnx.defs.SchemaError:
        return False
    return bool(schema.function_opset_versions or schema.context_dependent_function_opset_versions)
