"""Rewrite a model so that plain ai.onnx ops compute a JVP: one tangent input per x, one output J·v.

The model is prepared as for the gradient (contrib ops and ops onnxruntime lacks written out, the opset
raised to 17 where it is lower, Gradient nodes lowered), then the tangent nodes are added beside the
forward ones: the lowered model runs the forward pass once, with no backward pass.
"""
from __future__ import annotations

from onnx import ModelProto

from ...errors import LoweringError
from ...gradient.selection import names as split_names
from ...modelfile.writer import materialize
from ..build import finished, prepared
from .core import pruned, tangent_pass


def lower_jvp(model, y: str, xs, zs=None, *, tangents=None, name: str | None = None,
              check: bool = True) -> ModelProto:
    """A copy of `model` that also computes J·v of y along new graph inputs `tangents` (one per x, shaped
    like it; default `t_{x}`), as a new output `name` (default `jvp_{y}`)."""
    proto, data = lowered_jvp(model, y, xs, zs, tangents=tangents, name=name, check=check)
    return materialize(proto, data)


def lowered_jvp(model, y: str, xs, zs=None, *, tangents=None, name: str | None = None,
                check: bool = True) -> tuple[ModelProto, dict]:
    """`lower_jvp` with the large initializers' bytes left out of the proto (as `build.lowered`)."""
    from ...gradient.selection import validate
    from ...modelfile.index import index

    if not y or not xs:
        raise LoweringError("a JVP needs --y and --xs: name the tensor and what it is differentiated along")
    graph, state = prepared(model, selection=True)
    spec = validate(index(state.proto), y, split_names(xs), split_names(zs))
    inputs = list(split_names(tangents)) or [f"t_{x}" for x in spec.xs]
    if len(inputs) != len(spec.xs):
        raise LoweringError(f"{len(inputs)} tangent names for {len(spec.xs)} members of xs")
    output = name or f"jvp_{spec.y}"
    for taken in [t for t in inputs + [output] if t in state.used] + [t for t in inputs if inputs.count(t) > 1]:
        raise LoweringError(f"tangent name {taken!r} is already a tensor of the model or named twice: "
                            "choose others with --tangents / --names")
    ctx = state.ctx(f"jvp_{spec.y}")
    g = state.proto.graph
    for x, t in zip(spec.xs, inputs):
        g.input.append(state.declared(t, x, state.types.get(x)))
        if x in state.types:
            ctx.types[t] = state.types[x]
    known = tangent_pass(ctx, state.nodes, dict(zip(spec.xs, inputs)), set(spec.xs) | set(spec.zs), [spec.y])
    ty = known.get(spec.y) or ctx.fill_like(spec.y, 0.0)  # y reached from no x: J·v is zeros
    ctx.emit("Identity", [ty], [output])
    g.output.append(state.declared(output, spec.y, state.types.get(spec.y)))
    state.replace(None, pruned(ctx.nodes, state.nodes, [o.name for o in g.output]))
    return finished(graph, state, check)
