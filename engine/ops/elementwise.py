"""Elementwise math and casts (activations live in activation.py; bitwise, comparison and logic ops in logic.py)."""
from __future__ import annotations

import functools

import torch
from onnx import TensorProto

from ..dtypes import HALF_DTYPES, computes_in_float32, onnx_to_torch
from ..errors import OnnxGradError
from ..registry import describe, register
from .tangents import differentiated


def _legacy(a, b, broadcast, axis):
    """Opsets 1-6: B broadcasts onto A only when `broadcast` is set, aligned at `axis` if given."""
    if not broadcast or axis is None:
        return b
    axis = axis + a.dim() if axis < 0 else axis
    trailing = a.dim() - axis - b.dim()
    return b.reshape(tuple(b.shape) + (1,) * trailing) if trailing > 0 else b


# --- arithmetic -------------------------------------------------------------------------------

@describe("Add", needs="", rule=("dA = unbroadcast(dY)", "dB = unbroadcast(dY)"))
@register("Add", since=7)
def add(a, b):
    return a + b


@register("Add", since=1, until=6)
def add_v1(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
    return add(a, _legacy(a, b, broadcast, axis))


@describe("Sub", needs="", rule=("dA = unbroadcast(dY)", "dB = −unbroadcast(dY)"))
@register("Sub", since=7)
def sub(a, b):
    return a - b


@register("Sub", since=1, until=6)
def sub_v1(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
    return sub(a, _legacy(a, b, broadcast, axis))


@describe("Mul", needs="in", rule=("dA = unbroadcast(dY · B)", "dB = unbroadcast(dY · A)"))
@register("Mul", since=7)
def mul(a, b):
    return a * b


@register("Mul", since=1, until=6)
def mul_v1(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
    return mul(a, _legacy(a, b, broadcast, axis))


@describe("Div", needs="in", rule=("dA = unbroadcast(dY / B)", "dB = −unbroadcast(dY · A / B²)"))
@register("Div", since=7)
def div(a, b):
    # NOTE: integer division truncates toward zero (C semantics), as the reference does.
    if a.is_floating_point() or a.is_complex():
        return a / b
    return torch.div(a, b, rounding_mode="trunc")


@register("Div", since=1, until=6)
def div_v1(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
    return div(a, _legacy(a, b, broadcast, axis))


@describe("Pow", needs="in,out0", rule=("dX = unbroadcast(dY · E · X^(E − 1))", "dE = unbroadcast(dY · Y · log(X))"))
@register("Pow", since=7)
def pow_(x, y):
    # NOTE: the result keeps the base's type (an int base with a float exponent truncates).
    # d/dy x**y = x**y * log(x) is taken as 0 at x == 0 (torch's convention).
    if _scalar_exponent(x, y):
        # A constant exponent as a Python number: torch's x*x, sqrt, reciprocal... kernels, as
        # numpy, onnxruntime and torch eager (x.pow(2)) compute it, and a backward without the
        # tensor exponent's mask and broadcasting (most of a small Pow's cost).
        y = y.item()
    elif y.is_floating_point() and not x.is_floating_point():
        # An integer base: float64, as the reference's numpy (in the exponent's type 3**6 is 728 in bfloat16).
        return torch.pow(x.double(), y.double()).to(x.dtype)
    if x.dtype in HALF_DTYPES:  # torch's half pow is off by up to 8 (float16) and 30 (bfloat16) ulps
        return torch.pow(x.float(), y if isinstance(y, float) else y.float()).to(x.dtype)
    out = torch.pow(x, y)
    return out if out.dtype == x.dtype else out.to(x.dtype)


pow_.half_in_float32 = True  # the half branch above (docs/semantics.md lists these ops)


def _scalar_exponent(x, y) -> bool:
    """y is one float constant that cannot change x's shape, known here without a device sync."""
    return (y.numel() == 1 and y.dim() <= x.dim() and y.is_cpu and x.is_floating_point()
            and y.is_floating_point() and not differentiated(y)
            and not torch._C._functorch.is_functorch_wrapped_tensor(y) and not torch.compiler.is_compiling())


@register("Pow", since=1, until=6)
def pow_v1(x, y, *, broadcast=0, axis=None):
    return pow_(x, _legacy(x, y, broadcast, axis))


@describe("Mod", needs="in",
          rule=("dA = unbroadcast(dY)",
                "dB = −unbroadcast(dY · q)   # q = trunc(A / B) (fmod=1) or floor(A / B)"))
@register("Mod", since=10)
def mod(a, b, *, fmod=0):
    if fmod:
        return torch.fmod(a, b)
    if not a.is_floating_point():
        return torch.remainder(a, b)
    # NOTE: floats follow numpy's mod (sign of the divisor) including its inf/zero cases;
    # torch.remainder's a - b*floor(a/b) gives nan for a finite `a` over an infinite `b`.
    r = torch.fmod(a, b)
    shifted = torch.where((b < 0) != (r < 0), r + b, r)
    return torch.where(r == 0, torch.copysign(r, b), shifted)


@describe("Neg", needs="", rule="dX = −dY")
@register("Neg", since=1)
def neg(x, *, consumed_inputs=None):
    return torch.neg(x)


@describe("Abs", needs="in0", rule="dX = dY · sign(X)          # 0 at X == 0")
@register("Abs", since=1)
def abs_(x, *, consumed_inputs=None):
    # NOTE: the derivative at 0 is taken as sign(0) = 0, like torch.
    return torch.abs(x)


@describe("Sign", needs="", rule="dX = 0                     # piecewise constant")
@register("Sign", since=9)
def sign(x):
    return torch.sign(x)


@describe("Reciprocal", needs="out0", rule="dX = −dY · Y²")
@register("Reciprocal", since=1)
def reciprocal(x, *, consumed_inputs=None):
    return torch.reciprocal(x)


@describe("Sqrt", needs="out0", rule="dX = dY / (2·Y)")
@register("Sqrt", since=1)
def sqrt(x, *, consumed_inputs=None):
    return torch.sqrt(x)


@describe("Exp", needs="out0", rule="dX = dY · Y")
@register("Exp", since=1)
def exp(x, *, consumed_inputs=None):
    return torch.exp(x)


@describe("Log", needs="in0", rule="dX = dY / X")
@register("Log", since=1)
def log(x, *, consumed_inputs=None):
    return torch.log(x)


@describe("Floor", needs="", rule="dX = 0                     # piecewise constant")
@register("Floor", since=1)
def floor(x, *, consumed_inputs=None):
    return torch.floor(x)


@describe("Ceil", needs="", rule="dX = 0                     # piecewise constant")
@register("Ceil", since=1)
def ceil(x, *, consumed_inputs=None):
    return torch.ceil(x)


@describe("Round", needs="", rule="dX = 0                     # piecewise constant")
@register("Round", since=11)
def round_(x):
    # NOTE: halves go to the even neighbour (torch.round and ONNX agree).
    return torch.round(x)


@describe("Erf", needs="in0", rule="dX = dY · 2/√π · exp(−X²)")
@register("Erf", since=9)
@computes_in_float32  # NOTE: torch's CPU half kernel is off by up to 5 (float16) and 131 (bfloat16) ulps near 0
def erf(x):
    return torch.erf(x)


@describe("Sin", needs="in0", rule="dX = dY · cos(X)")
@register("Sin", since=7)
def sin(x):
    return torch.sin(x)


@describe("Cos", needs="in0", rule="dX = −dY · sin(X)")
@register("Cos", since=7)
def cos(x):
    return torch.cos(x)


@describe("Tan", needs="out0", rule="dX = dY · (1 + Y²)")
@register("Tan", since=7)
def tan(x):
    return torch.tan(x)


@describe("Asin", needs="in0", rule="dX = dY / sqrt(1 − X²)")
@register("Asin", since=7)
def asin(x):
    return torch.asin(x)


@describe("Acos", needs="in0", rule="dX = −dY / sqrt(1 − X²)")
@register("Acos", since=7)
def acos(x):
    return torch.acos(x)


@describe("Atan", needs="in0", rule="dX = dY / (1 + X²)")
@register("Atan", since=7)
def atan(x):
    return torch.atan(x)


@describe("Sinh", needs="in0", rule="dX = dY · cosh(X)")
@register("Sinh", since=9)
def sinh(x):
    return torch.sinh(x)


@describe("Cosh", needs="in0", rule="dX = dY · sinh(X)")
@register("Cosh", since=9)
def cosh(x):
    return torch.cosh(x)


@describe("Asinh", needs="in0", rule="dX = dY / sqrt(X² + 1)")
@register("Asinh", since=9)
def asinh(x):
    return torch.asinh(x)


@describe("Acosh", needs="in0", rule="dX = dY / sqrt(X² − 1)")
@register("Acosh", since=9)
def acosh(x):
    return torch.acosh(x)


@describe("Atanh", needs="in0", rule="dX = dY / (1 − X²)")
@register("Atanh", since=9)
def atanh(x):
    return torch.atanh(x)


@describe("IsNaN", no_gradient="a boolean result")
@register("IsNaN", since=9)
def isnan(x):
    return torch.isnan(x)


@describe("IsInf", no_gradient="a boolean result")
@register("IsInf", since=10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_positive:
        return torch.isposinf(x)
    if detect_negative:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


# --- variadic ---------------------------------------------------------------------------------

@describe("Max", needs="in,out0", rule=("dXᵢ = dY where input i is the max (ties share), 0 elsewhere",))
@register("Max", since=1)
def max_(*xs, consumed_inputs=None):
    # NOTE: ONNX defines no gradient at ties; torch.maximum splits it equally between the inputs.
    return functools.reduce(torch.maximum, xs)


@describe("Min", needs="in,out0", rule=("dXᵢ = dY where input i is the min (ties share), 0 elsewhere",))
@register("Min", since=1)
def min_(*xs, consumed_inputs=None):
    # NOTE: ONNX defines no gradient at ties; torch.minimum splits it equally between the inputs.
    return functools.reduce(torch.minimum, xs)


@describe("Sum", needs="", rule=("dXᵢ = unbroadcast(dY)    # the same for every input",))
@register("Sum", since=1)
def sum_(*xs, consumed_inputs=None):
    return functools.reduce(torch.add, xs)


@describe("Mean", needs="", rule=("dXᵢ = unbroadcast(dY) / n",))
@register("Mean", since=1)
def mean(*xs, consumed_inputs=None):
    return functools.reduce(torch.add, xs) / len(xs)


# --- types ------------------------------------------------------------------------------------

@describe("Cast", needs="", rule="dX = cast(dY, type(X))     # 0 when the target type is not float")
@register("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up"):
    # `saturate` and `round_mode` only concern float8 targets, which torch dtypes here lack
    # (onnx_to_torch rejects them with a specific message).
    return x.to(onnx_to_torch(to))


@register("Cast", since=1, until=5)
def cast_v1(x, *, to):
    # Opsets 1-5 name the target type as a string ("FLOAT", "INT64", ...).
    try:
        elem_type = TensorProto.DataType.Value(str(to).upper())
    except ValueError:
        raise OnnxGradError(f"Cast: unknown target type {to!r}") from None
    return x.to(onnx_to_torch(elem_type))


@describe("CastLike", needs="", rule="dX = cast(dY, type(X))     # 0 when target_type is not a float")
@register("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    return x.to(target_type.dtype)


@describe("Identity", needs="", rule="dX = dY")
@register("Identity", since=1)
def identity(x):
    return x
