"""Which forward values each op's VJP reads, besides the incoming gradient.

Each op says it beside its forward: `needs=` on its `@describe(...)` line in engine/ops/<family>.py,
read here through its record (`engine.registry.record(op).needs`): positions of inputs ("in0",
"in1", "in" for all) and outputs ("out0", "out" for all). An op that says nothing is assumed to
read every input, the safe answer for a teaching view: it may show a value the VJP does not
strictly need, never hide one it does.
"""
from __future__ import annotations

from typing import Sequence

from .. import registry

_READ: dict[tuple[str, str | None], tuple[str, ...]] = {}  # (op type, domain) -> parts, at one registry version
_AT_VERSION = [-1]


def _parts(op_type: str, domain: str | None) -> tuple[str, ...]:
    if _AT_VERSION[0] != registry.version():
        _READ.clear()
        _AT_VERSION[0] = registry.version()
    key = (op_type, domain)
    if key not in _READ:
        # No domain (a backward graph's node): the default domain's op first, then any other of that name.
        found = registry.records_named(op_type) if domain is None else [registry.record(op_type, domain)]
        needs = next((r.needs for r in found if r is not None and r.needs is not None), None)
        _READ[key] = ("in",) if needs is None else needs
    return _READ[key]


def vjp_needs(op_type: str, inputs: Sequence[str], outputs: Sequence[str], domain: str | None = None) -> tuple[str, ...]:
    """Forward tensor names the VJP of an op_type node with these inputs and outputs reads
    (empty names and duplicates dropped)."""
    picked: list[str] = []
    for part in _parts(op_type, domain):
        if part == "in":
            picked.extend(inputs)
        elif part == "out":
            picked.extend(outputs)
        elif part.startswith("in") and int(part[2:]) < len(inputs):
            picked.append(inputs[int(part[2:])])
        elif part.startswith("out") and int(part[3:]) < len(outputs):
            picked.append(outputs[int(part[3:])])
    return tuple(t for t in dict.fromkeys(picked) if t)
