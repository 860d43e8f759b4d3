"""check(): is this gradient right? Float64 finite differences against the engine's VJP, per x and per node."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping

import numpy as np
import torch

from .. import load
from ..errors import OnnxGradError
from ..model import Model
from . import fd
from .claimed import check_claimed, parse_claimed
from .context import Context, build
from .findings import first_nonfinite_gradient, first_nonfinite_value
from .native import native_errors
from .pernode import check_nodes, nodes_settle, settled_by_nodes
from .report import CheckReport, Finding
from .resolve import advice, settle_directions
from .second_order import check_second_order, check_second_order_hvp
from .status import CANCELLED, FAIL, INCONCLUSIVE, PASS
from .xcheck import Options, XProbe, skipped

MODES = ("auto", "full", "sample", "fast")
SECOND_ORDER = ("gradgrad", "hvp")
DEFAULT_SAMPLES = 64
# One direction, as gradcheck(fast_mode=True) takes: with a random dy and a Gaussian direction a
# wrong VJP shows almost surely, and the injected-bug catalogue is caught at every seed
# (benchmarks/bench_verify.py counts it against gradcheck's fast mode).
DEFAULT_DIRECTIONS = 1
# Bytes of forward values per batched call. Batching pays for per-call overhead, but past a few
# MB the working set leaves the cache and a batched conv gets slower per entry than single calls.
AUTO_FULL_ELEMENTS = 4096  # auto mode checks every element of xs up to this many ...
AUTO_FULL_BYTES = 2**32  # ... while elements times the bytes of a forward's values stays under this
MEMORY_BUDGET = 16 * 2**20
MAX_CHUNK = 2048


# long: the options checked in one place, then the stages in order (first order, forward mode, second order, nodes)
def check(model, y: str, xs, zs=(), feeds: Mapping | None = None, dy=None, mode: str = "auto", order: int = 1,
          claimed=None, rtol: float | None = None, atol: float | None = None, seed: int = 0,
          per_node: bool = False, samples: int | None = None, directions: int | None = None,
          time_budget: float | None = None, device="cpu", progress: Callable | None = None,
          should_stop: Callable[[], bool] | None = None, compile: bool = False,
          dims: Mapping[str, int] | None = None, locate: bool = True, forward: bool = False,
          second_order: str = "gradgrad") -> CheckReport:
    """Cross-check dy/dxs against float64 central differences; see docs/check-json.md for the report.

    `model` is a Model, a path or a ModelProto. Modes: full (every element), sample (`samples`
    random elements per x), fast (`directions` random directions per x, the gradient's own, and
    what resolve.py adds), auto (full where that is affordable, else fast: see `_auto`). A non-scalar y is seeded
    with a random dy (seeded) unless `dy` is given, or with ones when `claimed` gradients are checked.
    Members of xs ∪ zs nobody fed take the engine's defaults, symbolic dims sized by `dims`.
    `locate`: after a failure, check the nodes alone to name the failing one (off: the verdict only).
    `forward`: also check the engine's forward mode, J·v and the transpose identity (verify/forward.py).
    `second_order` (with order 2): "gradgrad", every item of d<w, dL/dx>/dx through create_graph, or
    "hvp", H·v along a random direction per x by forward over reverse (second_order.py).
    """
    started = time.monotonic()
    opts = _options(mode, order, rtol, atol, seed, samples, directions, time_budget)
    if second_order not in SECOND_ORDER:
        raise OnnxGradError(f"unknown second-order method {second_order!r}: use one of {', '.join(SECOND_ORDER)}")
    if second_order != "gradgrad" and order != 2:
        raise OnnxGradError(f"second_order={second_order!r} is a method for order 2: give order=2 (--order 2)")
    model = _loaded(model, compile)
    claimed_map = parse_claimed(claimed)
    ctx = build(model, y, xs, zs, feeds, dy, seed, device, ones_dy=bool(claimed_map), dims=dims)
    auto = opts.mode == "auto"
    if auto:
        opts.mode = _auto(ctx)
    for x in claimed_map:
        if x not in ctx.spec.xs:
            raise OnnxGradError(f"claimed gradient for {x!r}: {x!r} is not in xs")
    control = fd.Control(progress, should_stop, None if time_budget is None else started + float(time_budget))
    findings: list[Finding] = []
    opts.chunk = _chunk_size(ctx)
    _nonfinite(ctx, findings)
    native = native_errors(ctx, findings)
    results, probes = _check_xs(ctx, opts, control, native)
    deterministic, results, probes = _if_deterministic(ctx, findings, results, probes,
                                                       bool(claimed_map) or order == 2 or per_node or forward)
    claimed_results = check_claimed(ctx, claimed_map, probes, opts) if claimed_map else ()
    second = ()
    if order == 2 and deterministic:
        second = (check_second_order_hvp if second_order == "hvp" else check_second_order)(ctx, opts, control)
    jvps, transposes = _forward(ctx, opts, control, forward, deterministic)
    results, nodes = _through_nodes(ctx, opts, control, results, second, probes, findings,
                                    per_node=per_node, locate=locate, deterministic=deterministic)
    control.tick(0, "done", force=True)
    if control.stopped == "time budget":
        findings.append(Finding("time-budget", f"the time budget of {time_budget:g}s ran out: "
                                               "what was checked is a random sample"))
    results = [dataclasses.replace(r, advice=advice(r, probes.get(r.name), control.stopped, deterministic))
               if r.status in (INCONCLUSIVE, CANCELLED) else r for r in results]
    verdict = _overall(results, (*second, *jvps, *transposes), claimed_results, nodes, control, deterministic)
    return CheckReport(
        ok=verdict == PASS, verdict=verdict, mode=opts.mode, auto=auto, seed=seed, order=order, results=tuple(results),
        nodes=tuple(nodes), first_failing_node=next((n.node_name for n in nodes if n.status == FAIL), None),
        findings=tuple(findings), elapsed_s=time.monotonic() - started, model=model.name, y=ctx.spec.y,
        xs=ctx.spec.xs, zs=ctx.spec.zs, dy=ctx.dy_label, rtol=opts.rtol if opts.rtol is not None else _default_rtol(),
        atol=atol, samples=opts.samples if opts.mode == "sample" else None,
        directions=opts.directions if opts.mode == "fast" else None, second_order=tuple(second),
        claimed=tuple(claimed_results), truncated=bool(control.stopped), stopped=control.stopped,
        device=str(ctx.device), forward=forward, jvp=jvps, transpose=transposes,
        second_order_method=second_order if order == 2 else "")


def _forward(ctx: Context, opts: Options, control: fd.Control, forward: bool, deterministic: bool) -> tuple:
    """(J·v checks, transpose checks): none unless asked; inconclusive for a nondeterministic model."""
    if not forward:
        return (), ()
    if not deterministic:
        why = "the model is nondeterministic: finite differences are meaningless"
        return tuple(skipped(n, ctx.y0.shape, why, INCONCLUSIVE) for n in ctx.spec.xs), ()
    from .forward import check_forward

    return check_forward(ctx, opts, control)


def _loaded(model, compile: bool) -> Model:
    if not isinstance(model, Model):
        model = load(model)
    return model.compiled() if compile else model  # compiled: the forwards run under torch.compile


def _check_xs(ctx: Context, opts: Options, control: fd.Control, native: dict) -> tuple[list, dict]:
    """(results, probes): each x against finite differences of the whole model, judged again where
    the first judgement left it failing or unresolved; probes by the name of each x measured."""
    connected = [x for x in ctx.spec.xs if x not in ctx.disconnected]
    control.plan(sum(_planned(ctx.grads64[x].numel(), opts) for x in connected))
    control.tick(0, "finite differences", force=True)
    results, probes = [], {}
    for k, name in enumerate(ctx.spec.xs):
        shape = tuple(ctx.grads64[name].shape)
        if name in ctx.disconnected:
            results.append(skipped(name, shape, f"y does not depend on {name!r}: its gradient is zero", PASS))
            continue
        if ctx.y0.numel() == 0 or ctx.grads64[name].numel() == 0:
            # Nothing to differentiate: no element of x, or L = <dy, y> is an empty sum.
            what = f"x {name!r}" if ctx.grads64[name].numel() == 0 else f"y {ctx.spec.y!r}"
            results.append(skipped(name, shape, f"skipped: empty ({what} has no elements)", PASS))
            continue
        if control.halted():
            results.append(skipped(name, shape, f"not checked ({control.stopped})",
                                   CANCELLED if control.stopped == "cancelled" else INCONCLUSIVE))
            continue
        x = ctx.tensors64[ctx.sources.index(name)]
        probe = XProbe(name, ctx.x_function(name), x, ctx.y0, ctx.dy, opts, salt=k, control=control,
                       memo=ctx.x_memo(name, x.shape), magnitude=lambda name=name: ctx.downstream_magnitude(name),
                       split=lambda name=name: ctx.row_split(name),
                       along=ctx.grads64[name] if opts.mode == "fast" else None,
                       retry_coarse=opts.mode != "fast" or ctx.y0.numel() == 1)
        probes[name] = probe
        results.append(probe.result(probe.judge(ctx.grads64[name]), **native.get(name, {})))
    if any(_rejudge(r, probes) for r in results):
        results = _with_analytic_roundoff(ctx, probes, results, native)
    if opts.mode == "fast":  # directions too coarse to mean anything are compared again (resolve.py)
        results = [settle_directions(ctx, k, r.name, probes[r.name], r, opts, control)
                   if r.status == INCONCLUSIVE and r.name in probes else r for k, r in enumerate(results)]
    return results, probes


def _if_deterministic(ctx: Context, findings: list[Finding], results: list, probes: dict,
                      costlier_checks: bool) -> tuple[bool, list, dict]:
    """(deterministic, results, probes): a nondeterministic model's checked xs become inconclusive.

    A second forward tells whether the model is deterministic. Finite differences of a random
    model cannot pass, so the question only matters when something did not pass, or before the
    costlier checks (claimed gradients, second order, per node)."""
    if not (costlier_checks or any(r.status != PASS for r in results)) or _deterministic(ctx, findings):
        return True, results, probes
    return False, [skipped(r.name, r.shape, "the model is nondeterministic: finite differences are meaningless",
                           INCONCLUSIVE) if r.name in probes else r for r in results], {}


def _through_nodes(ctx: Context, opts: Options, control: fd.Control, results: list, second, probes: dict,
                   findings: list[Finding], *, per_node: bool, locate: bool, deterministic: bool) -> tuple[list, tuple]:
    """(results, nodes): the nodes on the path checked alone when asked (`per_node`), to locate a
    failure, or to settle what the whole-model comparison left inconclusive."""
    # A wrong claim lives in the model's own backward graph, not on the y <- xs path: only a
    # failing engine gradient sends the search to the nodes. A gradient that fails by being
    # NaN/Inf does not: the nonfinite-gradient finding names its node, and every node near the
    # NaN is inconclusive anyway (GPT-2 at 16 tokens: 720k node perturbations, 40 minutes).
    located = any(f.kind == "nonfinite-gradient" for f in findings)
    failed = any(r.status == FAIL and not (located and r.name in ctx.grads64 and not _all_finite(ctx.grads64[r.name]))
                 for r in results) or any(r.status == FAIL for r in second)
    # Whatever the whole-model comparison left inconclusive goes to the nodes: each alone is well
    # conditioned, and when every node on the path passes the gradient they compose is right.
    unsettled = [r.name for r in results if r.status == INCONCLUSIVE and r.name in probes]
    nodes = ()
    if (per_node or (failed and locate) or (unsettled and not failed)) and deterministic and not control.halted():
        nodes = check_nodes(ctx, opts, control)
    if unsettled and not failed and not control.halted() and nodes_settle(ctx, nodes):
        results = [settled_by_nodes(r, len(nodes)) if r.name in unsettled else r for r in results]
    return results, nodes


def _with_analytic_roundoff(ctx: Context, probes: dict, results: list, native: dict) -> list:
    """Failing xs (or unresolved ones, see _rejudge) judged again with atol widened by the float64
    gradient's own rounding error (see Context.analytic_roundoff): two more backwards, spent only
    where a check did not pass."""
    roundoff = ctx.analytic_roundoff()
    if roundoff is None:
        return results
    return [probes[r.name].result(probes[r.name].judge(ctx.grads64[r.name], roundoff[r.name]),
                                  **native.get(r.name, {}))
            if _rejudge(r, probes) else r for r in results]


def _rejudge(r, probes: dict) -> bool:
    """Failed, or left items that larger steps could not resolve (verify/absorbed.py): a gradient
    that is zero up to its own roundoff looks like either where the network rounds steps away."""
    return r.name in probes and (r.status == FAIL or probes[r.name].unresolved)


def _default_rtol() -> float:
    from .verdict import RTOL

    return RTOL


def _options(mode, order, rtol, atol, seed, samples, directions, time_budget) -> Options:
    if mode not in MODES:
        raise OnnxGradError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
    if order not in (1, 2):
        raise OnnxGradError(f"order must be 1 or 2, not {order!r}")
    for label, v in (("rtol", rtol), ("atol", atol), ("time_budget", time_budget)):
        if v is not None and not (isinstance(v, (int, float)) and v >= 0 and np.isfinite(v)):
            raise OnnxGradError(f"{label} must be a finite number >= 0, not {v!r}")
    for label, v in (("samples", samples), ("directions", directions)):
        if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
            raise OnnxGradError(f"{label} must be a positive integer, not {v!r}")
    if not isinstance(seed, (int, np.integer)):
        raise OnnxGradError(f"seed must be an integer, not {seed!r}")
    return Options(mode=mode, samples=int(samples or DEFAULT_SAMPLES), directions=int(directions or DEFAULT_DIRECTIONS),
                   rtol=rtol, atol=atol, seed=int(seed), chunk=64)


def _auto(ctx: Context) -> str:
    """Full mode where every element costs little in all, else fast mode (which resolve.py and the
    nodes carry to a resolved verdict). By size alone, so the same check picks the same mode on any
    machine: AUTO_FULL_ELEMENTS elements at most, and elements times the bytes of values a forward
    of the slice holds within AUTO_FULL_BYTES (a UNet's 1,280 inputs at 65 MB a forward would take
    minutes in full mode; a language model's 1,280 embedding values at 1 MB, seconds)."""
    elements = sum(ctx.grads64[x].numel() for x in ctx.spec.xs if x not in ctx.disconnected)
    if elements > AUTO_FULL_ELEMENTS:
        return "fast"
    return "full" if elements * ctx.bytes_per_forward() <= AUTO_FULL_BYTES else "fast"


def _planned(numel: int, opts: Options) -> int:
    if opts.mode == "fast":
        return 2 * (opts.directions + 1)
    if opts.mode == "sample":
        return 2 * min(opts.samples, numel)
    return 2 * numel


def _chunk_size(ctx: Context) -> int:
    """Perturbed evaluations per batched call: as many as MEMORY_BUDGET of forward values allows."""
    per_forward = ctx.bytes_per_forward()
    return int(max(2, min(MAX_CHUNK, MEMORY_BUDGET // max(per_forward, 1))))


def _deterministic(ctx: Context, findings: list[Finding]) -> bool:
    a, b = ctx.y_again(), ctx.y0
    if torch.equal(a, b):
        return True
    scale = float(b[torch.isfinite(b)].abs().max()) if bool(torch.isfinite(b).any()) else 0.0
    same = bool(((a - b).abs() <= 1e-9 * b.abs() + 1e-12 * scale).logical_or(a == b).logical_or(
        a.isnan() & b.isnan()).all())
    if not same:
        findings.append(Finding("nondeterministic", f"two runs of the model at the same point give different "
                                                    f"{ctx.spec.y!r} (a random op such as Dropout in training "
                                                    "mode?): finite differences cannot check it"))
    return same


def _all_finite(t: torch.Tensor) -> bool:
    if t.device.type == "cpu":  # numpy: a tenth of torch's dispatch on a small tensor
        return bool(np.isfinite(t.detach().numpy()).all())
    return bool(torch.isfinite(t).all())


def _nonfinite(ctx: Context, findings: list[Finding]) -> None:
    if not _all_finite(ctx.y0):
        f = first_nonfinite_value(ctx.plan64, _named(ctx), "float64")
        if f is not None:
            findings.append(f)
    if not all(_all_finite(g) for g in ctx.grads64.values()):
        n = len(ctx.spec.xs)
        leaves = [t.detach().requires_grad_() if k < n else t for k, t in enumerate(ctx.tensors64)]
        f = first_nonfinite_gradient(ctx.plan64, leaves, ctx.dy, n, "float64")
        if f is not None:
            findings.append(f)


def _named(ctx: Context) -> dict:
    return ctx.all_values


def _overall(results, second, claimed, nodes, control: fd.Control, deterministic: bool) -> str:
    """Per-node checks are diagnostics: a failing node fails the check, an inconclusive one (a MaxPool
    tie among Relu zeros, say) does not make a passing gradient inconclusive."""
    statuses = [r.status for r in (*results, *second, *claimed)]
    if control.stopped == "cancelled":
        return CANCELLED
    if FAIL in statuses or any(n.status == FAIL for n in nodes):
        return FAIL
    if INCONCLUSIVE in statuses or CANCELLED in statuses or not deterministic or control.stopped:
        return INCONCLUSIVE
    if not any(s == PASS for s in statuses):
        return INCONCLUSIVE
    return PASS

