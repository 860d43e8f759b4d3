"""Steps that check their inputs: a step whose op has a validator (`@validates`, engine/registry.py)
calls it before the forward, in every path that runs steps (the interpreter, the fx module, the
verifier's per-node runs), since all of them call `Step.fn`. Steps of ops without one keep their
function as it is and pay nothing. A step validates once per signature of input shapes and dtypes
(a validator that read an input's value, e.g. total_sequence_length, validates every call).

Fusion and lean swaps look functions up by identity, so the wrapping happens after them, when the
plan makes its `Step`s; a fused step stands for several nodes and is not checked as any one of them.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from ..errors import BadAttributeError
from ..modelfile.contrib_schema import signature
from ..ops import attribute_ranges
from ..ops.inputs import Inputs
from ..registry import validator


def checked(graph, raw: list) -> list:
    """A raw step ([node index, name, op type, fn, in slots, out slots, kwargs]) whose fn validates first:
    its integer attributes against their ranges (engine/ops/attribute_ranges.py), then its op's validator."""
    node = graph.nodes[raw[0]]
    own = raw[2] == node.op_type
    check = validator(node.domain, node.op_type) if own else None
    ranges = attribute_ranges.rules_for(node.op_type, raw[6]) if own else ()
    if check is None and not ranges:
        return raw
    fn, index = raw[3], input_index(node.domain, node.op_type, graph.opset(node.domain))
    passed: set = set()  # the input signatures (shapes, dtypes) this step's validator accepted

    def step(*args, **kwargs):
        key = signature_of(args)
        if key is None or key not in passed:
            attribute_ranges.check(ranges, args, kwargs)
            inputs = Inputs(index, args)
            if check is not None:
                check(inputs, **kwargs)
            if key is not None and not inputs.read_values:  # a validator that read a value checks every call
                if len(passed) >= 64:
                    passed.clear()
                passed.add(key)
        return fn(*args, **kwargs)

    step.__dict__.update(getattr(fn, "__dict__", {}))  # no_fold, fused: what readers of steps look for
    if ranges:
        kwargs = raw[6]
        step.attribute_check = lambda args: attribute_ranges.check(ranges, args, kwargs)
    step.__wrapped__ = fn
    step.__qualname__ = step.__name__ = f"checked_{getattr(fn, '__name__', 'op')}"
    return [*raw[:3], step, *raw[4:]]


def precheck(step, shapes: list) -> None:
    """Check `step`'s attributes against its inputs' inferred (shape, dtype) pairs, before the run: the memory
    guard asks first, so a size an attribute asked for is refused as that attribute, not as bytes."""
    check = getattr(step.fn, "attribute_check", None)
    if check is None:
        return
    args = [None if shape is None or dtype is None else _meta(shape, dtype) for shape, dtype in shapes]
    try:
        check(args)
    except BadAttributeError as exc:
        raise BadAttributeError(f"node {step.name!r} ({step.op_type}): {exc}") from None


def _meta(shape, dtype) -> torch.Tensor | None:
    """A shape-only stand-in for an input; None (not known) where its byte count overflows int64, which only
    the memory guard's refusal can then name."""
    try:
        return torch.empty(shape, dtype=dtype, device="meta")
    except RuntimeError:
        return None


def signature_of(args) -> tuple | None:
    """What a shape-only validator's verdict depends on: each input's shape and dtype (None: not only tensors)."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.shape, a.dtype))
        elif a is None:
            key.append(None)
        else:
            return None
    return tuple(key)


@lru_cache(maxsize=None)
def input_index(domain: str, op_type: str, opset: int) -> dict[str, int]:
    """Schema input name -> position: onnxruntime's contrib signatures, else onnx's schema, else in0, in1..."""
    names = signature(domain, op_type)
    if names is not None:
        return {n: i for i, n in enumerate(names[0])}
    try:
        import onnx.defs

        schema = onnx.defs.get_schema(op_type, opset, domain)
        return {p.name: i for i, p in enumerate(schema.inputs)}
    except Exception:  # noqa: BLE001 - a user's op with no schema: positional names
        return {f"in{i}": i for i in range(64)}
