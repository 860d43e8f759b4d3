"""`--ops FILE.py`: import a user's module that registers ops, without a script around the API.

The file registers forward + VJP pairs with `engine.register_op_with_vjp` (or plain forwards with
`engine.register`) when imported, and may say what each op's gradient is beside it: rule text and
VJP needs with `engine.registry.describe`, an ai.onnx expansion for `engine.lower` with
`engine.lowering.registry.expansion`; see docs/cli.md. Every failure is one line naming the file.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback

from . import registry
from .errors import OnnxGradError


def load_ops_file(path: str) -> tuple[str, ...]:
    """Import `path`; the ops it registered ("com.example::MyOp"), or OnnxGradError in one line."""
    if not os.path.exists(path):
        raise OnnxGradError(f"--ops {path}: no such file")
    if os.path.isdir(path) or not path.endswith(".py"):
        raise OnnxGradError(f"--ops {path}: give a Python file (.py) that registers ops")
    if _UNDO and _UNDO[-1] is None:
        _UNDO[-1] = _saved_state()
    before = {id(e) for e in registry.supported_ops()}
    name = "onnxgrad_user_ops_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise OnnxGradError(f"--ops {path}: syntax error on line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        line = next((f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__))
                     if os.path.abspath(f.filename) == os.path.abspath(path)), None)
        where = f" on line {line}" if line else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OnnxGradError(f"--ops {path}: {type(exc).__name__}{where}: {first}".rstrip(": ")) from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    added = tuple(dict.fromkeys((f"{e.domain}::" if e.domain else "") + e.op_type
                                for e in registry.supported_ops() if id(e) not in before))
    if not added:
        raise OnnxGradError(f"--ops {path} registered no op: call engine.register_op_with_vjp(...) in it")
    return added


_UNDO: list = []  # one entry per open `registrations_undone` block: the registry to restore, once saved


def _saved_state() -> tuple:
    registry._ensure_builtins()  # the op families first, so restoring keeps them
    custom = sys.modules.get(f"{__package__}.verify.custom")
    lowering = sys.modules.get(f"{__package__}.lowering.registry")  # only users fill EXPANDED
    return ({key: list(entries) for key, entries in registry._REGISTRY.items()},
            dict(custom._ACTIVE) if custom is not None else None, dict(registry._DESCRIBED),
            dict(lowering.EXPANDED) if lowering is not None else {})


def _restore(saved: tuple) -> None:
    entries, active, described, expanded = saved
    registry._REGISTRY.clear()
    registry._REGISTRY.update(entries)
    registry._DESCRIBED.clear()
    registry._DESCRIBED.update(described)
    registry._VERSION[0] += 1
    custom = sys.modules.get(f"{__package__}.verify.custom")
    if custom is not None:
        custom._ACTIVE.clear()
        custom._ACTIVE.update(active or {})
    lowering = sys.modules.get(f"{__package__}.lowering.registry")
    if lowering is not None:
        lowering.EXPANDED.clear()
        lowering.EXPANDED.update(expanded)


@contextlib.contextmanager
def registrations_undone():
    """Ops that `load_ops_file` registers (and describes) inside the block are unregistered after it, so one CLI
    command called in-process (`engine.cli.main`, the docs' tests) leaves the registry as it was.
    Nothing is saved (and no torch imported) unless an ops file is loaded."""
    _UNDO.append(None)
    try:
        yield
    finally:
        saved = _UNDO.pop()
        if saved is not None:
            _restore(saved)
