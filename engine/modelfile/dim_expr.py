"""Dim expressions: exporters name a dim `past_sequence_length + sequence_length`, `2*s0` or
`floor(s0/2)`. A tiny parser (no eval) reads them, so that a size set for the names inside sizes
the expression too, and a size seen for the expression can give back the one name it lacks.

Grammar: sums and differences of products (`*`, `/`, `//`, `%`) of integers, names, unary minus,
parentheses and the calls floor, ceil(ing), min, max (as sympy prints them, in any case).
A dim that does not parse, or is a lone name, is a plain name.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Mapping, Union

Node = Union[tuple, int, str]  # int: a number; str: a name; (op, a, b) / ("neg", a) / ("call", fn, args)

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*/%(),]))")
_CALLS = {"floor": math.floor, "ceil": math.ceil, "ceiling": math.ceil, "floortoint": math.floor,
          "ceiltoint": math.ceil, "min": min, "max": max}


class _Unparsed(Exception):
    pass


def _tokens(text: str) -> list[str | int]:
    out: list[str | int] = []
    pos, text = 0, text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Unparsed
        number, name, op = m.groups()
        out.append(int(number) if number is not None else name if name is not None else ("op", op))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens):
        self.tokens, self.at = tokens, 0

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, op: str | None = None):
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise _Unparsed
        self.at += 1
        return tok

    def sum(self) -> Node:
        node = self.product()
        while self.peek() in (("op", "+"), ("op", "-")):
            node = (self.take()[1], node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while self.peek() in (("op", "*"), ("op", "/"), ("op", "//"), ("op", "%")):
            node = (self.take()[1], node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek() == ("op", "-"):
            self.take()
            return ("neg", self.unary())
        if self.peek() == ("op", "+"):
            self.take()
            return self.unary()
        return self.atom()

    def atom(self) -> Node:
        tok = self.take()
        if tok == ("op", "("):
            node = self.sum()
            self.take(")")
            return node
        if isinstance(tok, int):
            return tok
        if isinstance(tok, str):
            if self.peek() != ("op", "("):
                return tok
            if tok.lower() not in _CALLS:
                raise _Unparsed
            self.take("(")
            args = [self.sum()]
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.sum())
            self.take(")")
            return ("call", tok.lower(), tuple(args))
        raise _Unparsed


@lru_cache(maxsize=1024)
def parse(text: str) -> Node | None:
    """The expression tree of a dim, or None when it does not parse."""
    try:
        parser = _Parser(_tokens(text))
        node = parser.sum()
        return node if parser.peek() is None else None
    except _Unparsed:
        return None


def is_expression(dim) -> bool:
    """A named dim that is an expression over other names (or numbers), not one plain name."""
    return isinstance(dim, str) and not isinstance(parse(dim), (str, type(None)))


def names_in(dim: str) -> tuple[str, ...]:
    """The names an expression reads, in order; a plain name (or an unparsable dim) is its own."""
    node = parse(dim)
    if node is None or isinstance(node, str):
        return (dim,)
    out: list[str] = []

    def walk(n):
        if isinstance(n, str):
            out.append(n)
        elif isinstance(n, tuple):
            for part in (n[2] if n[0] == "call" else n[1:]):
                walk(part)

    walk(node)
    return tuple(dict.fromkeys(out))


def _value(node: Node, dims: Mapping[str, int]) -> Fraction:
    if isinstance(node, int):
        return Fraction(node)
    if isinstance(node, str):
        return Fraction(int(dims[node]))  # KeyError: an unknown name
    if node[0] == "neg":
        return -_value(node[1], dims)
    if node[0] == "call":
        args = [_value(a, dims) for a in node[2]]
        return Fraction(_CALLS[node[1]](*args))
    a, b = _value(node[1], dims), _value(node[2], dims)
    if node[0] == "+":
        return a + b
    if node[0] == "-":
        return a - b
    if node[0] == "*":
        return a * b
    if node[0] == "/":
        return a / b
    if node[0] == "//":
        return Fraction(a // b)
    return a % b


def evaluate(dim, dims: Mapping[str, int]) -> int | None:
    """The size of a named dim: set in `dims` by its own name, else its expression evaluated from
    the names inside; None when a name is unset, or the value is no integer."""
    if not isinstance(dim, str):
        return None
    if dim in dims:
        return int(dims[dim])
    node = parse(dim)
    if node is None:
        return None
    try:
        value = _value(node, dims)
    except (KeyError, ZeroDivisionError):
        return None
    return int(value) if value.denominator == 1 else None


def solve(dim: str, size: int, dims: Mapping[str, int]) -> tuple[str, int] | None:
    """(name, value) for the one name of `dim` that `dims` lacks, when the expression is affine in
    it (a + b, 2*a - 1) and `size` gives it a whole non-negative value; else None."""
    dims = {k: v for k, v in dims.items() if k != dim}  # its own size, seen in a feed, is what to match
    missing = [n for n in names_in(dim) if n not in dims]
    if len(missing) != 1 or not is_expression(dim):
        return None
    name = missing[0]
    at = [evaluate(dim, {**dims, name: x}) for x in (0, 1, 2)]
    if None in at or at[1] - at[0] == 0 or at[2] - at[1] != at[1] - at[0]:
        return None
    step = at[1] - at[0]
    if (size - at[0]) % step:
        return None
    value = (size - at[0]) // step
    if value < 0 or evaluate(dim, {**dims, name: value}) != size:
        return None
    return name, value
