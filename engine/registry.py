"""The op registry: (domain, op_type, opset range) -> a small torch function.

Conventions (every op module follows them):
- `fn(*inputs, **attributes)`: inputs are torch tensors in ONNX order, `None` for an omitted
  optional input; trailing omitted inputs are not passed, so Python defaults apply.
- Attributes arrive as keyword arguments with ONNX names: ints, floats, str, lists, and
  torch tensors (already on the run's device) for TENSOR attributes.
- A function may also declare the keyword-only context parameters `n_outputs` (how many
  outputs the node declares), `device` (the run's torch.device) and `float_dtype` (the dtype
  every float tensor is promoted to in this run, or None); the plan fills them.
- Return a tensor, or a tuple/list with one entry per declared output.
- Register with `@register("Op", since=..., until=...)` right above the definition, and say what its
  gradient is with `@describe("Op", rule=..., needs=...)` (or `no_gradient=why`) above that: rule
  text, VJP needs and forward live together, and `record(op_type, domain)` reads them as one OpRecord
  with the op's lowering (engine/oprecord.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Mapping

from .errors import UnsupportedOpError

if TYPE_CHECKING:
    from .oprecord import OpRecord

CONTEXT_PARAMS = ("n_outputs", "device", "float_dtype")


@dataclass(frozen=True)
class OpImpl:
    domain: str
    op_type: str
    since: int
    until: int | None  # inclusive; None means every later opset
    fn: Callable
    note: str = ""

    @property
    def opset_range(self) -> str:
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    @property
    def accepted_attributes(self) -> frozenset[str] | None:
        """Attribute names the function takes; None when it takes **kwargs."""
        return _accepted(self.fn)

    @property
    def context(self) -> tuple[str, ...]:
        params = parameters(self.fn)
        return tuple(p for p in CONTEXT_PARAMS if p in params)


def parameters(fn: Callable):
    """`inspect.signature(fn).parameters`, once per function: a plan binds every node of the graph,
    and reading signatures afresh was most of the time to build one on a 10,000-node model."""
    try:
        return _parameters(fn)
    except TypeError:  # an unhashable callable (an instance with __eq__ and no __hash__)
        import inspect

        return inspect.signature(fn).parameters


@lru_cache(maxsize=None)
def _parameters(fn: Callable):
    import inspect  # here, not at the top: `onnxgrad ops` and --help never need it

    return inspect.signature(fn).parameters


def _accepted(fn: Callable) -> frozenset[str] | None:
    import inspect

    params = parameters(fn).values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(
        p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in CONTEXT_PARAMS
    )


_REGISTRY: dict[tuple[str, str], list[OpImpl]] = {}
_DESCRIBED: dict[tuple[str, str], _Description] = {}  # (domain, op type) -> what `describe` said
_BUILTIN_DESCRIBED: dict[tuple[str, str], _Description] = {}  # what engine/ops described, for `remove` to restore
_VALIDATORS: dict[tuple[str, str], Callable] = {}  # (domain, op type) -> its `@validates` function
_BUILTIN_VALIDATORS: dict[tuple[str, str], Callable] = {}  # engine/ops' own, for `remove` to restore
_IN_OPS_PACKAGE = [False]  # engine/ops/__init__.py is importing the families (whoever imported it first)
_VERSION = [0]  # bumped on every change, so callers can cache what they looked up


def version() -> int:
    return _VERSION[0]
_builtins = "absent"  # -> "loading" -> "loaded": engine.ops fills the registry on first use, not at `import engine`


def _ensure_builtins() -> None:
    """Import the op families once, before any lookup or outside registration (so theirs cannot clash later)."""
    global _builtins
    if _builtins != "absent":
        return
    _builtins = "loading"
    try:
        from . import ops  # noqa: F401  lazy cycle: the families register themselves through this module
    except BaseException:
        _builtins = "absent"
        raise
    _builtins = "loaded"


@contextlib.contextmanager
def loading_builtins():
    """engine/ops/__init__.py imports the families inside this: what they describe is built in."""
    _IN_OPS_PACKAGE[0] = True
    try:
        yield
    finally:
        _IN_OPS_PACKAGE[0] = False


def builtins_loaded() -> bool:
    return _builtins == "loaded"


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register(op_type: str, *, domain: str = "", since: int = 1, until: int | None = None, note: str = ""):
    """Decorator: register `fn` for `op_type` over opsets [since, until]."""

    def deco(fn: Callable) -> Callable:
        add(OpImpl(_norm_domain(domain), op_type, since, until, fn, note))
        return fn

    return deco


def add(impl: OpImpl, *, replace: bool = False) -> None:
    _ensure_builtins()
    entries = _REGISTRY.setdefault((impl.domain, impl.op_type), [])
    clashes = [e for e in entries if _overlap(e, impl)]
    if clashes and not replace:
        raise ValueError(f"{impl.op_type} opsets {impl.opset_range} overlap an existing registration")
    for e in clashes:
        entries.remove(e)
    _VERSION[0] += 1
    entries.append(impl)
    entries.sort(key=lambda e: e.since)


def remove(domain: str, op_type: str, since: int | None = None) -> None:
    _ensure_builtins()
    key = (_norm_domain(domain), op_type)
    entries = _REGISTRY.get(key, [])
    _VERSION[0] += 1
    entries[:] = [e for e in entries if since is not None and e.since != since]
    if not entries:
        _REGISTRY.pop(key, None)
        _DESCRIBED.pop(key, None)  # a user's description goes with the op's last forward; a built-in one comes back
        if key in _BUILTIN_DESCRIBED:
            _DESCRIBED[key] = _BUILTIN_DESCRIBED[key]
        _VALIDATORS.pop(key, None)
        if key in _BUILTIN_VALIDATORS:
            _VALIDATORS[key] = _BUILTIN_VALIDATORS[key]


def _overlap(a: OpImpl, b: OpImpl) -> bool:
    a_hi = a.until if a.until is not None else 10**9
    b_hi = b.until if b.until is not None else 10**9
    return a.since <= b_hi and b.since <= a_hi


def lookup(domain: str, op_type: str, opset: int) -> OpImpl | None:
    _ensure_builtins()
    for impl in reversed(_REGISTRY.get((_norm_domain(domain), op_type), [])):
        if impl.covers(opset):
            return impl
    return None


def require(domain: str, op_type: str, opset: int, node_name: str) -> OpImpl:
    impl = lookup(domain, op_type, opset)
    if impl is not None:
        return impl
    dom = _norm_domain(domain)
    known = _REGISTRY.get((dom, op_type))
    qual = f"{dom}::{op_type}" if dom else op_type
    if known:
        ranges = ", ".join(e.opset_range for e in known)
        raise UnsupportedOpError(
            f"node {node_name!r}: {qual} is supported for opsets {ranges}, not opset {opset}", qual, node_name
        )
    # One line, not the whole registry: the closest names, and where the full list is.
    import difflib

    names = sorted({(d + "::" if d else "") + op for d, op in _REGISTRY})
    close = difflib.get_close_matches(qual, names, n=3, cutoff=0.75)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnsupportedOpError(
        f"node {node_name!r}: op {qual} (opset {opset}) is not supported ({hint}`onnxgrad ops` lists the "
        "supported ops; `--ops FILE.py` registers your own)", qual, node_name
    )


def supported_ops() -> list[OpImpl]:
    _ensure_builtins()
    return sorted((e for entries in _REGISTRY.values() for e in entries), key=lambda e: (e.domain, e.op_type, e.since))


class _Description:
    """What `describe` said about one op type; `record` joins it with the forwards in an OpRecord (built
    only when asked, so that loading the op families never pays for the dataclass)."""

    __slots__ = ("rule", "rule_by", "needs", "no_gradient")

    def __init__(self, rule, rule_by: tuple[str, ...], needs: tuple[str, ...] | None, no_gradient: str):
        self.rule, self.rule_by, self.needs, self.no_gradient = rule, rule_by, needs, no_gradient


def describe(op_type: str, *, domain: str = "", rule=None, needs: str | None = None, rule_by: tuple[str, ...] = (),
             no_gradient: str = "") -> Callable:
    """Say what `op_type`'s gradient is, right above its `@register` line (or anywhere, as a call).

    rule: the text step mode shows, one line per input (engine/oprecord.py has the conventions): a
    string is input 0's line (the other inputs get no gradient), a tuple one line per input, a dict
    variants keyed by the values of the `rule_by` attributes. needs: what the VJP reads ("in0,out0";
    "" for shapes only). no_gradient: why no gradient flows through the op at all, instead of the two.
    Describing a built-in op twice is an error; a user's description replaces the one before."""
    _ensure_builtins()
    key = (_norm_domain(domain), op_type)
    if no_gradient and (rule is not None or needs is not None):
        raise ValueError(f"{op_type}: no_gradient says no gradient flows; drop rule and needs")
    builtin = _IN_OPS_PACKAGE[0]
    if builtin and key in _BUILTIN_DESCRIBED:
        raise ValueError(f"{op_type} is described twice")
    said = _Description(_rule_text(rule, tuple(rule_by), op_type), tuple(rule_by), _needs(needs, op_type), no_gradient)
    _DESCRIBED[key] = said
    if builtin:
        _BUILTIN_DESCRIBED[key] = said
    _VERSION[0] += 1
    return lambda fn: fn


def validates(op_type: str, *, domain: str = "") -> Callable:
    """Decorator: `fn` checks a node of `op_type` before its forward runs, right beside that forward.

    `fn(inputs, **attributes)`: `inputs` an `engine.ops.inputs.Inputs` (the node's inputs by schema
    name: shapes, dtypes, values), the attributes as the forward's keyword arguments (context such as
    n_outputs too: take `**_`). It raises `InputShapeError` (one line: the input, expected and actual)
    for what the op refuses, and returns nothing; the plan names the node. Declaring it again replaces it."""

    def deco(fn: Callable) -> Callable:
        _ensure_builtins()
        key = (_norm_domain(domain), op_type)
        _VALIDATORS[key] = fn
        if _IN_OPS_PACKAGE[0]:
            _BUILTIN_VALIDATORS[key] = fn
        _VERSION[0] += 1
        return fn

    return deco


def validator(domain: str, op_type: str) -> Callable | None:
    """The `@validates` function of (domain, op type), None when it has none (the plan pays nothing)."""
    return _VALIDATORS.get((_norm_domain(domain), op_type))


def _needs(needs: str | None, op_type: str) -> tuple[str, ...] | None:
    if needs is None:
        return None
    parts = tuple(p.strip() for p in needs.split(",") if p.strip())
    for p in parts:
        digits = p[3:] if p.startswith("out") else p[2:] if p.startswith("in") else "x"
        if digits and not digits.isdigit():
            raise ValueError(f"{op_type}: needs {needs!r}: write positions as in0, out1, or in / out for all")
    return parts


def _rule_text(rule, rule_by: tuple[str, ...], op_type: str):
    """A described rule as stored: one line alone is input 0's (no gradient to the others)."""
    if rule is None or isinstance(rule, tuple):
        return rule
    if isinstance(rule, str):
        return (rule, None)
    if isinstance(rule, Mapping):
        if not rule_by:
            raise ValueError(f"{op_type}: a rule with variants needs rule_by, the attributes that pick one")
        return {tuple(k): tuple(v) for k, v in rule.items()}
    return tuple(rule)


def record(op_type: str, domain: str = "") -> OpRecord | None:
    """Everything about one op type: forwards, rule text, VJP needs, validator, lowering; None for an unknown op."""
    from .oprecord import OpRecord

    _ensure_builtins()
    key = (_norm_domain(domain), op_type)
    forwards, said, validate = tuple(_REGISTRY.get(key, ())), _DESCRIBED.get(key), _VALIDATORS.get(key)
    if said is None:
        return OpRecord(*key, forwards=forwards, validate=validate) if forwards else None
    return OpRecord(*key, forwards=forwards, rule=said.rule, rule_by=said.rule_by, needs=said.needs,
                    no_gradient=said.no_gradient, validate=validate)


def records() -> list[OpRecord]:
    """A record for every op type that has a forward or a description, sorted by (domain, op type)."""
    _ensure_builtins()
    return [record(op, domain) for domain, op in sorted(set(_REGISTRY) | set(_DESCRIBED))]


def records_named(op_type: str) -> list[OpRecord]:
    """The records of `op_type` in every domain, the default domain's first."""
    _ensure_builtins()
    keys = {k for k in set(_REGISTRY) | set(_DESCRIBED) if k[1] == op_type}
    return [record(op, domain) for domain, op in sorted(keys, key=lambda k: (k[0] != "", k[0]))]
