"""The gradient in the model's own dtype against float64: reported per x, never the verdict (the
method is float64 finite differences; this says how much the model's precision costs).

A float16 or bfloat16 gradient is judged against what the dtype's rounding of the values explains:
the float64 gradient through the same graph with every forward value rounded to the dtype it has
in the native run (straight through: the forward sees rounded values, the backward is float64).
That rounding flips the same ReLU and MaxPool decisions and saturates the same tanh as the native
run, which alone moves a ReLU network's float16 input gradient by several percent of its scale;
what is left (the native backward's arithmetic, ops that compute inside in the half type, as
Attention's softmax does by default) must stay within NATIVE_ULPS units of roundoff of the
gradient's scale. float32 and float64 keep a plain tolerance against float64 (NATIVE_TOLERANCE).
"""
from __future__ import annotations

import torch

from ..dtypes import HALF_DTYPES
from ..errors import OnnxGradError
from ..run.plan import StepObserver
from .context import F64, Context
from .findings import first_nonfinite_value
from .report import Finding
from .status import FAIL, PASS

NATIVE_TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (1e-3, 1e-6)}  # (rtol, atol of the scale)
# Units of the half type's roundoff allowed beyond what rounding the values explains, relative to
# the gradient's scale: the node cases' float16 Attention (softmax in float16, as the spec's default
# precision) reach 19; a wrong cast or a half kernel that loses digits is off by orders more.
NATIVE_ULPS = 32


class _Rounding(StepObserver):
    """Rounds every float64 value to the dtype the native run gave it, straight through; and, with
    `saved`, what the backward saves inside steps that compute in the half type (not inside ops
    that compute in float32, engine.dtypes.computes_in_float32: they save float32)."""

    def __init__(self, dtypes: dict[str, torch.dtype], saved: torch.dtype | None):
        self.dtypes, self.saved, self.inside_half = dtypes, saved, True

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.saved is None or not self.inside_half or t.dtype != F64:
            return t
        return t.detach().to(self.saved).to(F64)

    def arguments(self, step, names, args):
        self.inside_half = not getattr(step.fn, "half_in_float32", False)
        return args

    def _round(self, name, value):
        dtype = self.dtypes.get(name)
        if not isinstance(value, torch.Tensor) or value.dtype != F64 or dtype is None or dtype == F64:
            return value
        exact = value.detach()
        return value + (exact.to(dtype).to(F64) - exact)

    def source(self, name, value):
        return self._round(name, value)

    def outputs(self, step, args, names, outs):
        return [self._round(n, v) for n, v in zip(names, outs)]


def _rounded_gradients(ctx: Context, native_values: dict) -> list:
    """dy/dxs in float64 with every forward value rounded to its native dtype, and every tensor the
    backward saves rounded to the half type (the native backward reads a saturated tanh's 1.0, not
    0.99998), None where x is disconnected."""
    dtypes = {n: v.dtype for n, v in native_values.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    half = next((d for d in dtypes.values() if d in HALF_DTYPES), None)
    xs = set(ctx.spec.xs)
    leaves = [t.detach().clone().requires_grad_(n in xs) for n, t in zip(ctx.sources, ctx.tensors64)]

    rounding = _Rounding(dtypes, half)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(rounding.pack, lambda t: t):
        y = ctx.keep_plan.run_observed(leaves, rounding)[0]
        wanted = [leaf for n, leaf in zip(ctx.sources, leaves) if n in xs]
        if not y.requires_grad:
            return [None] * len(wanted)
        return list(torch.autograd.grad(y, wanted, ctx.dy, allow_unused=True))


def native_errors(ctx: Context, findings: list[Finding]) -> dict[str, dict]:
    """Per x: the native dtype, its errors against float64 and, for half types, whether it is
    within the dtype's precision (`native_status`) and what rounding the values alone costs."""
    spec, model = ctx.spec, ctx.model
    native = ctx.native_tensors()
    floats = [t for t in native if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if all(t.dtype == F64 for t in floats):
        return {}
    extras = ctx.sources[len(spec.inputs):]
    prepared = model.prepare_gradient(spec.y, spec.xs, spec.zs, device=ctx.device, dtype=None, extra_inputs=extras)
    try:
        out = prepared(*native, dy=ctx.dy)  # cast to y's dtype by the call
    except OnnxGradError as exc:
        findings.append(Finding("native", f"the gradient in the model's own dtype could not be computed: {exc}"))
        return {}
    half = any(g is not None and g.dtype in HALF_DTYPES for g in out.grads)
    values = None
    if half or (not bool(torch.isfinite(out.y).all()) and bool(torch.isfinite(ctx.y0).all())):
        plan = model.prepare(ctx.sources, [spec.y], device=ctx.device, keep_all=True)
        with torch.no_grad():
            values = plan.run_all(native)
        if not bool(torch.isfinite(out.y).all()) and bool(torch.isfinite(ctx.y0).all()):
            f = first_nonfinite_value(plan, values, "native-dtype")
            if f is not None:
                findings.append(Finding("nonfinite-native", f.message + " (finite in float64: overflow or underflow)",
                                        tensor=f.tensor, node=f.node))
    rounded = _rounded_gradients(ctx, values) if half else [None] * len(spec.xs)
    noise = (ctx.analytic_roundoff() or {}) if half else {}
    result = {}
    for name, g, r in zip(spec.xs, out.grads, rounded):
        ref = ctx.grads64[name]
        g64 = g.detach().to(F64)
        diff = (g64 - ref).abs()
        dtype = str(g.dtype).removeprefix("torch.")
        rel = diff / torch.clamp(torch.maximum(g64.abs(), ref.abs()), min=1e-300)
        entry = dict(native_dtype=dtype, native_max_abs_err=_max(diff), native_max_rel_err=_max(rel))
        x_dtype = native[ctx.sources.index(name)].dtype
        if g.dtype != x_dtype:  # ONNX's Gradient gives each x's gradient x's own type
            entry["native_status"] = FAIL
            findings.append(Finding("native-precision", f"the gradient of {name!r} is {dtype}, {name!r} itself is "
                                    f"{str(x_dtype).removeprefix('torch.')}", x=name))
        elif g.dtype in HALF_DTYPES:
            entry.update(_judge_half(name, g, g64, ref, r, noise.get(name), findings))
        else:
            _judge_plain(name, dtype, diff, rel, ref, findings)
        result[name] = entry
    return result


def _max(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def _judge_half(name: str, g: torch.Tensor, g64: torch.Tensor, ref: torch.Tensor, rounded, noise64,
                findings) -> dict:
    if rounded is None:  # no path from x to y through the rounded values: the float64 one stands in
        rounded = ref
    rounded = rounded.detach()
    ok = torch.isfinite(rounded)
    info = torch.finfo(g.dtype)
    scale = _max(rounded[ok].abs())
    # A gradient that cancels (a softmax's shift-invariant bias: zero up to roundoff) has terms far
    # larger than itself; float64's own roundoff on it, over float64's epsilon, measures them.
    if noise64 is not None and noise64.numel():
        scale = max(scale, _max(noise64[torch.isfinite(noise64)]) / torch.finfo(F64).eps)
    # The smallest subnormal is the type's absolute resolution: a gradient far below the values'
    # scale (a saturated tanh's) is quantized to it.
    allowed = NATIVE_ULPS * info.eps * (scale + info.tiny)
    off = (g64 - rounded).abs()
    # Beyond the type's range the native gradient overflows (the nonfinite-native note says where).
    ok &= rounded.abs() <= info.max
    beyond = ((off > allowed) | ~torch.isfinite(g64)) & ok
    status = FAIL if bool(beyond.any()) else PASS
    if status == FAIL:
        worst = _max(off[ok]) if ok.any() else float("nan")
        dtype = str(g.dtype).removeprefix("torch.")
        findings.append(Finding(
            "native-precision",
            f"the {dtype} gradient of {name!r} is off by up to {worst:.3g} ({int(beyond.sum())} elements) from "
            f"the float64 gradient through {dtype}-rounded values, beyond {NATIVE_ULPS} units of {dtype} roundoff "
            f"of its scale {scale:.3g}: more than the dtype's rounding explains", x=name))
    return dict(native_status=status, native_rounding_err=_max((rounded - ref).abs()[ok & torch.isfinite(ref)]))


def _judge_plain(name: str, dtype: str, diff, rel, ref, findings) -> None:
    scale = _max(ref.abs())
    rt, at = NATIVE_TOLERANCE.get(dtype, (1e-3, 1e-6))
    bad = (diff > at * scale) & (rel > rt)
    if bool(bad.any()) and bool(torch.isfinite(ref).all()):
        findings.append(Finding("native-precision",
                                f"the {dtype} gradient of {name!r} differs from the float64 one by up to "
                                f"{_max(diff):.3g} ({int(bad.sum())} elements beyond rtol {rt:g}): precision "
                                "of the model's dtype, not a wrong formula", x=name))
