"""Bitwise ops, comparisons and logic: none has a gradient, except Where through its x and y."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import UnsupportedOpError
from ..registry import describe, register
from .elementwise import _legacy

# --- bitwise ----------------------------------------------------------------------------------

def _bitshift(x, y, direction, logical):
    bits = torch.iinfo(x.dtype).bits
    valid = (y >= 0) & (y < bits)
    s = torch.where(valid, y, 0).to(x.dtype)
    if direction == "LEFT":
        return torch.where(valid, torch.bitwise_left_shift(x, s), 0)
    if direction != "RIGHT":
        raise UnsupportedOpError(f"BitShift direction {direction!r} is not supported; use LEFT or RIGHT")
    out = torch.bitwise_right_shift(x, s)
    if logical and x.dtype.is_signed:
        # Unsigned types wider than int8 are carried in signed torch types: shift in zeros.
        mask = torch.bitwise_left_shift(torch.ones_like(x), (bits - s) % bits) - 1
        out = torch.where(s == 0, out, out & mask)
        return torch.where(valid, out, 0)
    return torch.where(valid, out, torch.where(x < 0, -1, 0).to(x.dtype))


@register("BitShift", since=11, until=27)
def bitshift_v11(x, y, *, direction):
    # NOTE: opsets 11-27 take unsigned types only, so a right shift is logical.
    return _bitshift(x, y, direction, logical=True)


@describe("BitShift", no_gradient="an integer result")
@register("BitShift", since=28)
def bitshift(x, y, *, direction):
    # NOTE: uint64 is carried as int64, so a right shift of a uint64 with its top bit set
    # fills with ones here (signed int64 and uint64 cannot be told apart).
    return _bitshift(x, y, direction, logical=False)


@describe("BitwiseAnd", no_gradient="an integer result")
@register("BitwiseAnd", since=18)
def bitwise_and(a, b):
    return torch.bitwise_and(a, b)


@describe("BitwiseOr", no_gradient="an integer result")
@register("BitwiseOr", since=18)
def bitwise_or(a, b):
    return torch.bitwise_or(a, b)


@describe("BitwiseXor", no_gradient="an integer result")
@register("BitwiseXor", since=18)
def bitwise_xor(a, b):
    return torch.bitwise_xor(a, b)


@describe("BitwiseNot", no_gradient="an integer result")
@register("BitwiseNot", since=18)
def bitwise_not(x):
    return torch.bitwise_not(x)


# --- comparisons and logic --------------------------------------------------------------------

@describe("Equal", no_gradient="a boolean result")
@register("Equal", since=7)
def equal(a, b):
    if isinstance(a, np.ndarray):  # string tensors (Equal accepts them from opset 19) stay numpy
        return torch.from_numpy(np.equal(a, b).astype(bool))
    return torch.eq(a, b)


@register("Equal", since=1, until=6)
def equal_v1(a, b, *, broadcast=0, axis=None):
    return equal(a, _legacy(a, b, broadcast, axis))


@describe("Less", no_gradient="a boolean result")
@register("Less", since=7)
def less(a, b):
    return torch.lt(a, b)


@register("Less", since=1, until=6)
def less_v1(a, b, *, broadcast=0, axis=None):
    return less(a, _legacy(a, b, broadcast, axis))


@describe("LessOrEqual", no_gradient="a boolean result")
@register("LessOrEqual", since=12)
def less_or_equal(a, b):
    return torch.le(a, b)


@describe("Greater", no_gradient="a boolean result")
@register("Greater", since=7)
def greater(a, b):
    return torch.gt(a, b)


@register("Greater", since=1, until=6)
def greater_v1(a, b, *, broadcast=0, axis=None):
    return greater(a, _legacy(a, b, broadcast, axis))


@describe("GreaterOrEqual", no_gradient="a boolean result")
@register("GreaterOrEqual", since=12)
def greater_or_equal(a, b):
    return torch.ge(a, b)


@describe("And", no_gradient="a boolean result")
@register("And", since=7)
def and_(a, b):
    return torch.logical_and(a, b)


@register("And", since=1, until=6)
def and_v1(a, b, *, broadcast=0, axis=None):
    return and_(a, _legacy(a, b, broadcast, axis))


@describe("Or", no_gradient="a boolean result")
@register("Or", since=7)
def or_(a, b):
    return torch.logical_or(a, b)


@register("Or", since=1, until=6)
def or_v1(a, b, *, broadcast=0, axis=None):
    return or_(a, _legacy(a, b, broadcast, axis))


@describe("Xor", no_gradient="a boolean result")
@register("Xor", since=7)
def xor(a, b):
    return torch.logical_xor(a, b)


@register("Xor", since=1, until=6)
def xor_v1(a, b, *, broadcast=0, axis=None):
    return xor(a, _legacy(a, b, broadcast, axis))


@describe("Not", no_gradient="a boolean result")
@register("Not", since=1)
def not_(x):
    return torch.logical_not(x)


@describe("Where", needs="in0", rule=(None, "dA = dY · cond", "dB = dY · ¬cond"))
@register("Where", since=9)
def where(condition, x, y):
    # NOTE: the gradient flows only to the branch that was selected at each element.
    return torch.where(condition.to(torch.bool), x, y)
