"""Step mode's and the inspector's local gradient rules, formatted for one node.

The rule texts live with each op's forward (`@describe(...)` in engine/ops/<family>.py, conventions in
engine/oprecord.py) and are read through `engine.registry.record`; here they are only formatted: the
symbol each line is about (`symbol()`, so step mode can print which tensor it stands for), the
node's attributes filled in (defaults from the schema), and a generic vector-Jacobian line per
input for an op whose record has no text.
"""
from __future__ import annotations

from onnx import defs, helper

from engine.modelfile.contrib_schema import MS, signature
from engine.registry import record

GENERIC = "d{input} = J_{input}ᵀ · dY   # vector-Jacobian product of {op} w.r.t. {input}, by torch autograd"


def schema_names(op_type: str, domain: str = "", opset: int | None = None) -> tuple[list[str], list[str]]:
    """The op's formal input and output names (variadic ones repeated), or generic names."""
    try:
        schema = defs.get_schema(op_type, opset, domain) if opset else defs.get_schema(op_type, domain)
        return [i.name for i in schema.inputs], [o.name for o in schema.outputs]
    except Exception:  # onnxruntime's contrib ops are not in onnx's registry
        names = signature(domain, op_type)
        return (list(names[0]), list(names[1])) if names else ([], [])


def _attributes(node, op_type: str, domain: str, opset: int | None) -> dict[str, object]:
    values: dict[str, object] = {}
    try:
        schema = defs.get_schema(op_type, opset, domain) if opset else defs.get_schema(op_type, domain)
        for name, attr in schema.attributes.items():
            if attr.default_value is not None and attr.default_value.type:
                values[name] = helper.get_attribute_value(attr.default_value)
    except Exception:
        pass
    if node is not None:
        values.update({a.name: helper.get_attribute_value(a) for a in node.attribute})
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in values.items()}


class _Attributes(dict):
    """Attribute texts for rule templates; `{alpha·}` is "0.5·", or "" when alpha is 1."""

    UNSET = {"strides": "1", "pads": "0", "dilations": "1", "kernel_shape": "of the kernel's size",
             "activation": "identity", "alpha": "1.702"}  # the last two: FusedConv's and QuickGelu's defaults

    def __missing__(self, key):
        if key.endswith("·"):
            value = self.get(key[:-1], "1")
            return "" if value in ("1", "1.0") else f"{value}·"
        return self.UNSET.get(key, "default")


def symbol(line: str | None) -> str | None:
    """The input a rule line is about: "dA = dY · B" -> "A"."""
    if not line or "=" not in line:
        return None
    return line.split("=", 1)[0].strip().removeprefix("d") or None


def rule_lines(node, opset: int | None = None) -> list[tuple[str, str | None]]:
    """[(symbol, rule text or None when no gradient flows)], one per input of an ONNX node."""
    op, domain = node.op_type, node.domain
    formal_in, _ = schema_names(op, domain, opset)
    n = max(len(node.input), 1)
    names = [_formal(formal_in, i, n) for i in range(n)]
    attrs = _Attributes({k: _fmt(v) for k, v in _attributes(node, op, domain, opset).items()})
    table = _template(op, domain, attrs)
    lines = []
    for i, name in enumerate(names):
        if table is None:
            text = GENERIC.format(input=name, op=op)
        else:
            text = table[min(i, len(table) - 1)]
            text = None if text is None else text.format_map(attrs)
        lines.append((symbol(text) or name, text))
    return lines


def _template(op: str, domain: str, attrs) -> tuple[str | None, ...] | None:
    """The op's rule lines from its record; a node of another domain named like a standard op (not a
    com.microsoft one) reads the standard op's."""
    domain = "" if domain == "ai.onnx" else domain
    found = record(op, domain)
    lines = found.rule_lines(attrs) if found is not None else None
    if lines is None and domain not in ("", MS):
        found = record(op)
        lines = found.rule_lines(attrs) if found is not None else None
    return lines


def _formal(formal: list[str], i: int, n: int) -> str:
    if not formal:
        return f"input{i}"
    if i < len(formal) - 1 or n <= len(formal):
        return formal[min(i, len(formal) - 1)]
    return f"{formal[-1]}{i - len(formal) + 1}"  # variadic: Inputs1, Inputs2, ...


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)
