"""The built-in op table read from the `@register(...)` lines of engine/ops/*.py, without importing them.

`onnxgrad ops` answers from here so that it never imports torch (the op modules do). Anything the
scan cannot read as literals returns None, and the caller falls back to the live registry; a test
holds this table equal to `supported_ops()`.
"""
from __future__ import annotations

import ast
import os
import re

OPS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops")
_CONSTANT = re.compile(r'^([A-Z][A-Z0-9_]*) = ("[^"\\]*")\s*$')


def builtin_ops() -> list[dict] | None:
    """Rows {domain, op_type, since, until, note} sorted like `supported_ops()`; None if a line is not literal."""
    rows = []
    for fname in sorted(os.listdir(OPS_DIR)):
        if not fname.endswith(".py"):
            continue
        with open(os.path.join(OPS_DIR, fname), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        constants = {m.group(1): ast.literal_eval(m.group(2)) for m in map(_CONSTANT.match, lines) if m}
        for line in lines:
            if line.startswith("@register("):
                row = _row(line[1:], constants)
                if row is None:
                    return None
                rows.append(row)
    return sorted(rows, key=lambda r: (r["domain"], r["op_type"], r["since"]))


def _row(text: str, constants: dict[str, str]) -> dict | None:
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def value(node):
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        return ast.literal_eval(node)

    try:
        if len(call.args) != 1:
            return None
        kw = {k.arg: value(k.value) for k in call.keywords}
        op_type = value(call.args[0])
    except ValueError:
        return None
    if set(kw) - {"domain", "since", "until", "note"}:
        return None
    domain = kw.get("domain", "")
    return {"domain": "" if domain == "ai.onnx" else domain, "op_type": op_type, "since": kw.get("since", 1),
            "until": kw.get("until"), "note": kw.get("note", "")}
