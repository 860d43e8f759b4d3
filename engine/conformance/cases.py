"""ONNX's node test cases (onnx.backend.test.case.node), in memory, with what each one tests.

Every non-expanded case is one node; an `*_expanded` case is the same test with the op replaced
by its function body, so it is attributed to its twin's op and exercises the primitives inside.
"""
from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache

from onnx import ModelProto

_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass(frozen=True)
class CaseInfo:
    """What a case tests: `op` is the op under test (`domain::Op` outside the default domain)."""

    name: str
    op: str
    domain: str
    opset: int
    expanded: bool
    graph_ops: tuple[str, ...]  # op types the graph itself contains

    @property
    def twin(self) -> str:
        """The single-node case this one expands ('' for a non-expanded case)."""
        return _EXPANDED.sub("", base_name(self.name)) if self.expanded else ""


def base_name(name: str) -> str:
    """The ONNX case a variant's name (`test_relu[float16]`, conformance/variants.py) comes from."""
    return name.split("[", 1)[0]


@lru_cache(maxsize=1)
def node_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the generators divide by zero on purpose (inf/nan cases)
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


@lru_cache(maxsize=1)
def _by_name() -> dict:
    return {c.name: c for c in node_cases()}


def case_named(name: str):
    try:
        return _by_name()[name]
    except KeyError:
        raise KeyError(f"no ONNX node test case named {name!r}") from None


def qualified(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def opset_of(model: ModelProto, domain: str) -> int:
    for imp in model.opset_import:
        if (imp.domain or "") == (domain if domain != "ai.onnx" else ""):
            return imp.version
    return 1


@lru_cache(maxsize=None)
def _info(name: str) -> CaseInfo:
    return _describe(case_named(name))


def _describe(case) -> CaseInfo:
    expanded = bool(_EXPANDED.search(case.name)) and _EXPANDED.sub("", case.name) in _by_name()
    source = case_named(_EXPANDED.sub("", case.name)) if expanded else case
    node = source.model.graph.node[0]
    domain = node.domain or ""
    graph_ops = tuple(sorted({qualified(n.domain, n.op_type) for n in case.model.graph.node}))
    return CaseInfo(name=case.name, op=qualified(domain, node.op_type), domain=domain,
                    opset=opset_of(source.model, domain), expanded=expanded, graph_ops=graph_ops)


def case_info(case) -> CaseInfo:
    """What `case` tests; any object with .name, .model and .data_sets works (the first node is the op)."""
    if _by_name().get(case.name) is case:
        return _info(case.name)
    if getattr(case, "source", None) in _by_name():  # a half variant tests what its source tests
        return dataclasses.replace(_info(case.source), name=case.name)
    return _describe(case)


def cases_for(op_types, *, expanded: bool = True) -> list:
    """Cases whose op under test, or whose graph, involves any of `op_types` (as listed in `case_info`)."""
    wanted = set(op_types)
    out = []
    for c in node_cases():
        info = case_info(c)
        if not expanded and info.expanded:
            continue
        if info.op in wanted or wanted & set(info.graph_ops):
            out.append(c)
    return out


def tolerances(case) -> tuple[float, float]:
    """(rtol, atol) as onnx's own runner reads them (its defaults are 1e-3 and 1e-7)."""
    rtol = getattr(case, "rtol", None)
    atol = getattr(case, "atol", None)
    return (1e-3 if rtol is None else rtol), (1e-7 if atol is None else atol)
