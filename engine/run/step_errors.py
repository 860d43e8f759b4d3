"""What a step that fails raises: one line naming the node (and, for an allocation that failed, the
size asked for), whatever torch, numpy or an op's own code raised inside it."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from ..errors import ExecutionError, MemoryLimitError, OnnxGradError

if TYPE_CHECKING:
    from .plan import Step

# AttributeError: what an op's tensor code raises on a value of another kind (a sequence where the schema
# wants a tensor), which plan.type_clash then names
STEP_ERRORS = (OnnxGradError, RuntimeError, ValueError, TypeError, IndexError, MemoryError, ArithmeticError,
               AttributeError)
# torch's CPU allocator: "... can't allocate memory: you tried to allocate 140737488355328 bytes. Error code 12 ..."
_ASKED = re.compile(r"(?:can't allocate memory|out of memory).*?tried to allocate (\d+ bytes|[0-9.]+ ?[KMGTP]i?B)",
                    re.IGNORECASE)


def step_error(step: Step | None, exc: Exception, outputs: Sequence[str] = ()) -> Exception:
    """The error to raise for `exc` inside `step`: one line that names the node (and, for an allocation
    that failed, the `outputs` it was computing)."""
    if step is None or (isinstance(exc, OnnxGradError) and str(exc).startswith("node ")):
        return exc
    if isinstance(exc, OnnxGradError):
        err = type(exc)(f"node {step.name!r} ({step.op_type}): {exc}")
    else:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        memory = out_of_memory(exc, msg)
        if memory is not None:
            computing = f" computing {', '.join(map(repr, outputs))}" if outputs else ""
            err = MemoryLimitError(f"node {step.name!r} ({step.op_type}) ran out of memory{computing}{memory}")
        else:
            err = ExecutionError(f"node {step.name!r} ({step.op_type}) failed: {msg or type(exc).__name__}")
    err.node_index = getattr(step, "node_index", None)  # for a caller that acts on the node (forward mode's fallback)
    return err


def out_of_memory(exc: Exception, msg: str) -> str | None:
    """None when `exc` is not an allocation failure; else what is known of the size asked for."""
    found = _ASKED.search(msg)
    if found:
        asked = found.group(1)
        return f" (it asked for {size_text(int(asked.split()[0]))})" if asked.endswith(" bytes") else f" (it asked for {asked})"
    if isinstance(exc, MemoryError):  # numpy says "Unable to allocate 256. TiB for an array ..."; C++'s bad_alloc nothing
        return f": {msg}" if msg else " (the size asked for is not known)"
    return None


def size_text(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
