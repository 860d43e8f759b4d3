"""Which node is wrong: each node on the y <- xs path checked alone, at the values it really saw.

A node's check is the model check in miniature: L = sum_o <dy_o, out_o> with a random dy per float
output, its VJP (torch.autograd through the registered op, or a custom op's hand-written VJP)
against float64 central differences of the node's forward, one input at a time. A perturbation
costs one node's forward, not the model's.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..modelfile.index import TRAINING_DOMAIN
from .absorbed import largest
from .fd import normal
from .report import NodeCheck, XCheck
from .status import FAIL, INCONCLUSIVE, PASS, SKIPPED
from .xcheck import XProbe

NODE_FULL_LIMIT = 4096  # node inputs up to this many elements are checked element by element
NO_FLOAT_OUTPUT = "no float output"
COMPOSED_REL = 1e-9  # fused and unfused float64 backwards agree to rounding: far inside this
RANDOM_OPS = {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Bernoulli"}


def path_steps(ctx):
    """Steps of the float64 keep-all plan that read an xs-dependent float value, with those inputs."""
    plan = ctx.keep_plan
    active = {x for x in ctx.spec.xs if x not in ctx.disconnected}
    values = ctx.all_values
    for step in plan.steps:
        ins = [plan.names[s] if s is not None else None for s in step.in_slots]
        live = [k for k, n in enumerate(ins) if n in active and _is_float(values.get(n))]
        if not live:
            continue
        for s in step.out_slots:
            if s is not None and _is_float(values.get(plan.names[s])):
                active.add(plan.names[s])
        yield step, ins, live


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def check_nodes(ctx, opts, control) -> tuple[NodeCheck, ...]:
    steps = list(path_steps(ctx))
    control.plan(sum(_planned(ctx, ins, live, opts) for _, ins, live in steps))
    results = []
    for step, ins, live in steps:
        if control.halted():
            results.append(NodeCheck(step.name, step.op_type, SKIPPED, None, None,
                                     f"not checked ({control.stopped})", node_index=step.node_index))
            continue
        results.append(_check_node(ctx, step, ins, live, opts, control))
    return tuple(results)


def _node_mode(numel: int) -> str:
    """A node's perturbation costs one node's forward: every element of a small input, whatever the
    model-level mode (a sample could miss the one wrong element), random directions above that."""
    return "full" if numel <= NODE_FULL_LIMIT else "fast"


def _planned(ctx, ins, live, opts) -> int:
    total = 0
    for k in live:
        n = ctx.all_values[ins[k]].numel()
        total += 2 * (n if _node_mode(n) == "full" else opts.directions)
    return total


def _check_node(ctx, step, ins, live, opts, control) -> NodeCheck:
    graph = ctx.model.graph
    node = graph.nodes[step.node_index]
    base = dict(node_name=step.name, op_type=step.op_type, node_index=step.node_index,
                inputs=tuple(ins[k] for k in live))
    if node.domain == TRAINING_DOMAIN or step.op_type in RANDOM_OPS:
        return NodeCheck(status=SKIPPED, max_abs_err=None, max_rel_err=None,
                         reason="random or Gradient nodes are not checked alone", **base)
    values = ctx.all_values
    inputs = [values.get(n) if n is not None else None for n in ins]
    outs = [(k, ctx.keep_plan.names[s]) for k, s in enumerate(step.out_slots)
            if s is not None and _is_float(values.get(ctx.keep_plan.names[s]))]
    if not outs:
        return NodeCheck(status=SKIPPED, max_abs_err=None, max_rel_err=None, reason=NO_FLOAT_OUTPUT, **base)
    ranks = [values[name].dim() for _, name in outs]
    dys = [normal(values[name].shape, [opts.seed, step.node_index, k], values[name]) for k, name in outs]
    dy_flat = torch.cat([d.reshape(-1) for d in dys])

    def forward(args):
        out = step.fn(*args, **step.kwargs)
        out = out if isinstance(out, (tuple, list)) else (out,)
        # Flatten only the node's own dims, so a leading batch axis (native batching) survives.
        return torch.cat([out[k].flatten(out[k].dim() - r) if r else out[k].unsqueeze(-1)
                          for (k, _), r in zip(outs, ranks)], dim=-1)

    try:
        leaves = [v.detach().clone().requires_grad_() if k in live else v for k, v in enumerate(inputs)]
        with torch.enable_grad():
            y = forward(leaves)
            grads = torch.autograd.grad(y, [leaves[k] for k in live], dy_flat.to(y.dtype), allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - a node that cannot be replayed alone is reported, not fatal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return NodeCheck(status=SKIPPED, max_abs_err=None, max_rel_err=None,
                         reason=f"could not replay the node alone: {first}", **base)
    y0 = y.detach()
    node_opts = dataclasses.replace(opts)
    worst = None
    for j, k in enumerate(live):
        x = inputs[k]
        grad = grads[j] if grads[j] is not None else torch.zeros_like(x)
        node_opts.mode = _node_mode(x.numel())

        def f(xx, k=k):
            return forward(inputs[:k] + [xx] + inputs[k + 1:])

        probe = XProbe(ins[k], f, x, y0, dy_flat, node_opts, salt=10007 + step.node_index * 31 + k,
                       control=control, stage=f"node {step.name}", magnitude=lambda: largest(y0))
        r = probe.result(probe.judge(grad))
        if worst is None or _rank(r) > _rank(worst[1]):
            worst = (ins[k], r)
    name, r = worst
    return NodeCheck(status=r.status, max_abs_err=r.max_abs_err, max_rel_err=r.max_rel_err,
                     reason=f"input {name!r}: {r.reason}" if r.reason else "", worst_input=name,
                     worst_index=r.worst_index, analytic=r.analytic, numeric=r.numeric, kind=r.kind, **base)


def _rank(r) -> tuple:
    order = {FAIL: 3, INCONCLUSIVE: 2, PASS: 1}
    return order.get(r.status, 0), (r.max_rel_err or 0.0) if np.isfinite(r.max_rel_err or 0.0) else np.inf


def nodes_settle(ctx, nodes) -> bool:
    """Whether passing node checks settle the gradient: every node on the path passed alone, and the
    engine's gradient is the node-by-node composition they verified (the run plan may fuse chains,
    engine/run/fusion.py, whose backward no node check saw: the unfused backward must agree with it)."""
    # A node with no float output passes no gradient on (Greater, Shape): nothing there to verify.
    if not nodes or any(n.status != PASS and n.reason != NO_FLOAT_OUTPUT for n in nodes):
        return False
    plan = getattr(ctx.gradient, "plan", None)
    if plan is None or plan.run_steps is plan.steps:
        return True
    unfused = ctx.gradient(*ctx.tensors64, dy=ctx.dy, create_graph=True).grads
    for name, g in zip(ctx.spec.xs, unfused):
        ref = ctx.grads64[name]
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        if not bool(((g.detach() - ref).abs() <= COMPOSED_REL * scale).all()):
            return False
    return True


def settled_by_nodes(r: XCheck, count: int) -> XCheck:
    """An x the whole-model comparison left inconclusive, passed by its nodes."""
    why = f"; before that: {r.reason}" if r.reason else ""
    return dataclasses.replace(r, status=PASS, resolved_by="nodes",
                               reason=f"the whole-model comparison did not resolve it; each of the {count} nodes on "
                                      f"the path from xs to y passed alone{why}")
