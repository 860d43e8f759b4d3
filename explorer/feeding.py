"""Where a fed tensor's value comes from, and how to compute it. No Textual here.

A feed is a source, not an array: the inspector shows "random(seed=3)" rather than numbers, and
an expression over other feeds is re-evaluated when those feeds change.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from engine.errors import FeedError
from engine.gradient.dims import dims_from_feeds
from engine.gradient.feeds import declared_dtype, declared_shape, parse_spec
from engine.gradient.past_feeds import coherent_dims, past_plan

FEED_KINDS = ("random", "zeros", "ones", "constant", "npy", "expression")  # what the feed dialog offers
MADE_UP = "made-up"  # an LLM's positions or lengths, which follow its past (engine.gradient.past_feeds): not offered


@dataclass(frozen=True)
class FeedSource:
    kind: str
    seed: int = 0
    constant: float = 0.0
    path: str = ""
    expression: str = ""

    def __post_init__(self):
        if self.kind not in FEED_KINDS and self.kind != MADE_UP:
            raise FeedError(f"unknown feed kind {self.kind!r}; use one of {', '.join(FEED_KINDS)}")

    def describe(self) -> str:
        if self.kind == "random":
            return f"random(seed={self.seed})"
        if self.kind == "constant":
            return f"constant {self.constant:g}"
        if self.kind == "npy":
            return f"file {os.path.basename(self.path)}"
        if self.kind == "expression":
            return f"= {self.expression}"
        if self.kind == MADE_UP:
            return f"made up: {self.expression}"
        return self.kind

    @property
    def parameter(self) -> str:
        """The text a feed dialog shows in its parameter field."""
        return {"random": str(self.seed), "constant": f"{self.constant:g}", "npy": self.path,
                "expression": self.expression}.get(self.kind, "")


def source_from(kind: str, parameter: str = "") -> FeedSource:
    """A FeedSource from a dialog's kind and parameter text; FeedError says what is wrong.

    A full spec typed as the parameter wins over the kind, so the keyboard alone is enough:
    "zeros", "ones", "random:3", "file.npy", "=2*X + 1".
    """
    parameter = parameter.strip()
    if parameter.startswith("="):
        kind, parameter = "expression", parameter[1:].strip()
    elif parameter in ("zeros", "ones"):
        kind, parameter = parameter, ""
    elif parameter.startswith("random:"):
        kind, parameter = "random", parameter.split(":", 1)[1]
    elif parameter.endswith(".npy"):
        kind = "npy"
    if kind == "random":
        try:
            return FeedSource("random", seed=int(parameter or 0))
        except ValueError:
            raise FeedError(f"the seed must be an integer, not {parameter!r}") from None
    if kind == "constant":
        try:
            return FeedSource("constant", constant=float(parameter))
        except ValueError:
            raise FeedError(f"the constant must be a number, not {parameter!r}") from None
    if kind == "npy":
        if not parameter:
            raise FeedError("give the path of a .npy file")
        return FeedSource("npy", path=os.path.expanduser(parameter))
    if kind == "expression":
        if not parameter:
            raise FeedError("write an expression, e.g. 2*X + 1 or sin(W)")
        parse_expression(parameter)
        return FeedSource("expression", expression=parameter)
    return FeedSource(kind)


# --- expressions ---------------------------------------------------------------------------------
def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


FUNCTIONS: dict[str, Callable] = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "abs": np.abs, "tanh": np.tanh, "sigmoid": _sigmoid, "relu": lambda a: np.maximum(a, 0),
    "sum": np.sum, "mean": np.mean, "min": np.min, "max": np.max, "transpose": np.transpose,
    "reshape": lambda a, *shape: np.reshape(a, shape), "clip": np.clip, "sign": np.sign,
}
_BINARY = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide,
           ast.Pow: np.power, ast.MatMult: np.matmul, ast.Mod: np.mod}
_UNARY = {ast.USub: np.negative, ast.UAdd: np.positive}
EXPRESSION_HELP = ("numbers, tensor names, X[0, :2], + - * / ** @ %, " + ", ".join(sorted(FUNCTIONS))
                   + "; t('name') for a name that is not an identifier")


def parse_expression(text: str) -> ast.Expression:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise FeedError(f"cannot parse expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Load, ast.Name, ast.Call,
                             ast.Subscript, ast.Slice, ast.Tuple)) or type(node) in _BINARY or type(node) in _UNARY:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
            continue
        raise FeedError(f"expression {text!r} uses {type(node).__name__}; allowed: {EXPRESSION_HELP}")
    return tree


def referenced_names(text: str) -> list[str]:
    """Tensor names an expression reads (identifiers that are not functions, and t('...') calls)."""
    out = []
    for node in ast.walk(parse_expression(text)):
        if isinstance(node, ast.Name) and node.id not in FUNCTIONS and node.id != "t":
            out.append(node.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "t"
              and node.args and isinstance(node.args[0], ast.Constant)):
            out.append(str(node.args[0].value))
    return out


def evaluate_expression(text: str, lookup: Callable[[str], np.ndarray]) -> np.ndarray:
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                raise FeedError(f"{node.id} is a function: call it, e.g. {node.id}(X)")
            return lookup(node.id)
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.Subscript):
            return np.asarray(ev(node.value))[ev(node.slice)]
        if isinstance(node, ast.Slice):
            return slice(*(None if part is None else int(ev(part)) for part in (node.lower, node.upper, node.step)))
        if isinstance(node, ast.Tuple):
            return tuple(ev(e) for e in node.elts)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or (node.func.id not in FUNCTIONS and node.func.id != "t"):
                raise FeedError(f"unknown function in {text!r}; allowed: {EXPRESSION_HELP}")
            args = [ev(a) for a in node.args]
            if node.func.id == "t":
                return lookup(str(args[0]))
            return FUNCTIONS[node.func.id](*args)
        raise FeedError(f"cannot evaluate {type(node).__name__} in {text!r}")

    with np.errstate(all="ignore"):
        try:
            return np.asarray(ev(parse_expression(text)))
        except FeedError:
            raise
        except (ValueError, TypeError, IndexError) as exc:
            raise FeedError(f"expression {text!r} failed: {str(exc).splitlines()[0]}") from None


# --- materializing ---------------------------------------------------------------------------------
def materialize(graph, sources: Mapping[str, FeedSource], constants: Callable[[str], np.ndarray | None],
                dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Arrays for every source, expressions evaluated after the feeds they read (cycles refused).

    `constants(name)` gives an initializer's value for expressions that read one, else None.
    Symbolic dims are sized by `dims`, else by the .npy files fed (they come first), else 1.
    """
    done: dict[str, np.ndarray] = {}
    active: list[str] = []
    sizes = dict(dims or {})

    def value(name: str) -> np.ndarray:
        if name in done:
            return done[name]
        if name in active:
            loop = " -> ".join(active[active.index(name):] + [name])
            raise FeedError(f"feed expressions form a cycle: {loop}")
        if name not in sources:
            const = constants(name)
            if const is None:
                raise FeedError(f"an expression reads {name!r}, which is neither fed nor a constant: feed it first")
            return const
        active.append(name)
        try:
            done[name] = _one(graph, name, sources[name], value, sizes)
        finally:
            active.pop()
        return done[name]

    files = [n for n, s in sources.items() if s.kind == "npy"]
    for name in files:
        value(name)
    sizes = coherent_dims(graph, dims_from_feeds(graph, done, dims))
    for name in sources:
        value(name)
    return done


def _one(graph, name: str, source: FeedSource, lookup, dims: Mapping[str, int]) -> np.ndarray:
    if source.kind == MADE_UP:
        plan = past_plan(graph, dims)
        value = plan.choose(graph, name, "zeros", 0)[0] if plan is not None else None
        return value if value is not None else parse_spec(graph, name, "zeros", dims=dims)
    if source.kind == "random":
        return parse_spec(graph, name, f"random:{source.seed}", dims=dims)
    if source.kind in ("zeros", "ones"):
        return parse_spec(graph, name, source.kind, dims=dims)
    if source.kind == "constant":
        return parse_spec(graph, name, repr(source.constant), dims=dims)
    if source.kind == "npy":
        path = source.path if source.path.endswith(".npy") or os.path.sep in source.path else "./" + source.path
        return parse_spec(graph, name, path, dims=dims)
    raw = evaluate_expression(source.expression, lookup)
    shape, dtype = declared_shape(graph, name, dims), declared_dtype(graph, name)
    try:
        return np.ascontiguousarray(np.broadcast_to(raw, shape)).astype(dtype)
    except ValueError:
        raise FeedError(f"feed {name!r}: the expression gives shape {raw.shape}, "
                        f"which does not broadcast to {name}'s shape {shape}") from None
