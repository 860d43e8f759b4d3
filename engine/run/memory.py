"""The memory guard: a run fails in one line naming the node, the output, its shape and its bytes
before a step allocates more than the machine can still give, instead of the kernel killing the
process for a size the model asked for.

"Can still give" is the kernel's MemAvailable, or the cgroup's limit minus its usage (less its
inactive page cache, which the kernel reclaims first) where that is lower, or under `ulimit -v` the
address space left; ONNXGRAD_MEMORY_AVAILABLE
(bytes, or "512MiB", "8GiB") replaces the reading. A plan's outputs are sized before the run from
the shapes shape inference left in the graph, their symbolic dims resolved from the shapes fed; the
live total follows the plan's own frees, so a long chain whose values die young passes, and many
steps each under the limit but together over it fail at the step that crosses it. Outputs whose
size depends on values (ConstantOfShape, Tile, Range, Resize, Pad, OneHot, and an elementwise step
reading an Expand) are sized from their inputs right before their step runs (engine/run/guard.py).
What neither knows is left to the allocator, whose failure becomes the same one line
(engine/run/step_errors.py).

Reading /proc/meminfo costs about 70 µs, more than a small model's whole run: a reading serves
every run for a second while what the run may hold stays under half of it.
"""
from __future__ import annotations

import math
import os
import re
from time import monotonic
from typing import Sequence

import torch

from ..dtypes import onnx_to_torch
from ..errors import MemoryLimitError, OnnxGradError
from .step_errors import size_text

ENV = "ONNXGRAD_MEMORY_AVAILABLE"
FRESH_S = 1.0  # how long a reading serves runs that need under half of it
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as 2**63 rounded down to a page


def parse_size(text: str) -> int:
    """'8GiB', '512 MiB', '1000000' -> bytes; OnnxGradError for anything else."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not found or found.group(2).lower() not in _UNITS:
        raise OnnxGradError(f"{ENV}={text!r} is not a size: write bytes, or a number with KiB, MiB, GiB or TiB")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def available_bytes() -> int | None:
    """What the machine can still give this process now (None: not known, e.g. no /proc)."""
    override = os.environ.get(ENV)
    if override:
        return parse_size(override)
    readings = [r for r in (_meminfo_available(), _cgroup_room(), _address_space_room()) if r is not None]
    return min(readings) if readings else None


def _address_space_room() -> int | None:
    """Under `ulimit -v` (RLIMIT_AS), the limit less the address space already mapped: an allocation
    past it fails however much memory the machine has."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return max(0, limit - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError):
        pass
    return None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read()
        start = text.index(b"MemAvailable:") + len(b"MemAvailable:")
        return int(text[start:text.index(b"kB", start)]) * 1024
    except (OSError, ValueError):
        return None


def _cgroup_room() -> int | None:
    """The tightest limit - usage over this process's cgroup and its ancestors (v2, else v1)."""
    rooms = []
    for folder, limit_file, usage_file, inactive_key in _cgroup_folders():
        limit = _read_int(os.path.join(folder, limit_file))
        usage = _read_int(os.path.join(folder, usage_file))
        if limit is None or usage is None or limit >= _NO_LIMIT:
            continue
        rooms.append(limit - usage + _stat(os.path.join(folder, "memory.stat"), inactive_key))
    return max(0, min(rooms)) if rooms else None


_folders: list | None = None


def _cgroup_folders() -> list:
    """(folder, limit file, usage file, memory.stat key of inactive page cache) for each cgroup level
    that has a memory limit file; found once per process."""
    global _folders
    if _folders is None:
        _folders = []
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
            if hierarchy == "0" and controllers == "":
                _folders += _levels("/sys/fs/cgroup", path, ("memory.max", "memory.current", b"inactive_file"))
            elif "memory" in controllers.split(","):
                _folders += _levels("/sys/fs/cgroup/memory", path,
                                    ("memory.limit_in_bytes", "memory.usage_in_bytes", b"total_inactive_file"))
    return _folders


def _levels(mount: str, path: str, files: tuple) -> list:
    parts = [p for p in path.split("/") if p]
    folders = [os.path.join(mount, *parts[:n]) for n in range(len(parts) + 1)]
    return [(d, *files) for d in folders if os.path.exists(os.path.join(d, files[0]))]


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read().strip()
        return _NO_LIMIT if text == b"max" else int(text)
    except (OSError, ValueError):
        return None


def _stat(path: str, key: bytes) -> int:
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(key + b" "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _Reading:
    """The last reading and when it was taken, shared by every plan of the process."""

    value: int | None = None
    at: float = -math.inf


def room(need: int) -> int | None:
    """What the machine can still give, re-read unless a reading under FRESH_S old holds twice `need`."""
    now = monotonic()
    value = _Reading.value
    if value is None or need * 2 > value or now - _Reading.at > FRESH_S:
        value = _Reading.value = available_bytes()
        _Reading.at = now
    return value


def forget_reading() -> None:
    """The next run reads the machine again (tests that change ONNXGRAD_MEMORY_AVAILABLE)."""
    _Reading.value, _Reading.at = None, -math.inf


def refusal(node: str, op_type: str, output: str, shape: Sequence[int], dtype: torch.dtype, nbytes: int,
            can_give: int, alive: int = 0, cast: int = 0) -> MemoryLimitError:
    held = [f"the {size_text(alive)} the run's values hold by then"] if alive else []
    held += [f"the {size_text(cast)} of weights cast for this step"] if cast else []
    held = f" on top of {' and '.join(held)}" if held else ""
    return MemoryLimitError(
        f"node {node!r} ({op_type}): output {output!r} of shape {list(shape)} {str(dtype).removeprefix('torch.')} "
        f"needs {size_text(nbytes)} ({nbytes} bytes){held}, more than the {size_text(can_give)} the machine can "
        "still give")


def value_dtype(elem_type: int | None, float_dtype: torch.dtype | None) -> torch.dtype | None:
    """The torch dtype a value of ONNX type `elem_type` has in a plan computing floats in `float_dtype`."""
    if elem_type is None:
        return None
    try:
        dtype = onnx_to_torch(elem_type)
    except OnnxGradError:
        return None
    return float_dtype if float_dtype is not None and dtype.is_floating_point else dtype
