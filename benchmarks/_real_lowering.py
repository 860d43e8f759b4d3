"""`engine.lower` on the real architectures (`_real_models.LOWERING_CASES`, both exporters): the gradients
of the output w.r.t. the input (when float) and every float weight, seeded with a random dy, lowered to
plain ONNX, checked (full onnx.checker, strict shape inference) and run by onnxruntime, against the
engine's own gradients in float32.

The check, as tests/lowering/test_light.py's: relative L2 error per gradient <= L2_TOL. A gradient whose
float32 value is itself round-off (the engine in float32 is more than L2_TOL from the engine in float64,
e.g. a key bias, whose exact gradient is 0 because softmax ignores a per-row constant) passes when
onnxruntime is as close to the float64 gradient as the float32 engine is (within twice its distance).
Where a gradient still differs, the Relu / MaxPool decisions the two forwards take differently (float32
round-off within reach of a kink) are counted, and then the engine itself running the lowered graph (same
forward, same kinks) must match.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import _real_models as real_models
import numpy as np
import onnx
import torch

import engine

L2_TOL = 1e-4


@dataclass(frozen=True)
class RealLowering:
    name: str
    exporter: str
    opset: int
    nodes_forward: int
    nodes_lowered: int
    xs: int
    lower_s: float
    worst_l2: float  # onnxruntime vs the engine, over the gradients
    kink_flips: int = 0
    same_forward_l2: float = 0.0  # the engine running the lowered graph vs the engine, when kinks flipped
    round_off: int = 0  # gradients that are float32 round-off, judged against float64 (see above)
    problem: str = ""  # why it failed to lower, run or match ('' when it passed)
    errors: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problem


def gradient_xs(model, module, x_name: str) -> list[str]:
    """The input if float, then every float initializer that is not a scalar nor a BatchNorm buffer."""
    consts = model.constants()
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    xs = [x_name] if model.graph.types[x_name].elem_type == onnx.TensorProto.FLOAT else []
    return xs + [n for n, v in consts.items() if v.is_floating_point() and v.dim() >= 1 and v.numel() >= 2
                 and not any(b.shape == v.shape and torch.equal(b, v) for b in buffers)]


def ort_session(proto: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_run(proto: onnx.ModelProto, feeds: dict) -> dict:
    session = ort_session(proto)
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def prepared(case, exporter: str, cache: str | None = real_models.CACHE, dynamic: bool = False):
    """(proto, model, y, xs, zs, feeds, dy) of one exported architecture."""
    module, x = real_models.build(case)
    proto = onnx.load_from_string(real_models.export(module, x, exporter, cache=cache, dynamic=dynamic))
    model = engine.load(proto)
    (x_name,) = model.inputs
    xs = gradient_xs(model, module, x_name)
    zs = [] if x_name in xs else [x_name]
    y = model.outputs[0]
    feeds = {x_name: x.numpy()}
    shape = model.run(feeds, outputs=[y])[y].shape
    dy = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    return proto, model, y, xs, zs, feeds, dy


def kink_flips(proto, values_a: dict, values_b: dict) -> int:
    """Relu signs and MaxPool window maxima that differ between two forwards' values."""
    flips = 0
    for n in proto.graph.node:
        t = n.input[0] if n.input else ""
        if n.op_type == "Relu" and t in values_a and t in values_b:
            flips += int(((values_a[t] > 0) != (values_b[t] > 0)).sum())
        elif n.op_type == "MaxPool" and n.output[0] in values_a and n.output[0] in values_b:
            flips += int((values_a[n.output[0]] != values_b[n.output[0]]).sum())
    return flips


def other_size(feeds: dict) -> dict:
    """The same input with one more batch item (and, for token ids, four fewer tokens)."""
    (name, x), = feeds.items()
    x = np.concatenate([x, x[:1]], axis=0)
    return {name: x if x.dtype.kind == "f" else x[:, :-4]}


@dataclass(frozen=True)
class Judged:
    """One input size's comparison of onnxruntime on the lowered model with the engine."""

    worst_l2: float
    errors: dict
    round_off: int = 0
    kink_flips: int = 0
    same_forward_l2: float = 0.0
    problem: str = ""


def judge(model, proto, lowered, y, xs, zs, feeds, dy) -> Judged:
    """onnxruntime's gradients against the engine's at `feeds` (see the module's docstring)."""
    names = [f"grad_{i}" for i in range(len(xs))]
    fed = {**feeds, f"d{y}": dy}
    kinks = list(dict.fromkeys(t for n in proto.graph.node if n.op_type in ("Relu", "MaxPool")
                               for t in (n.input[0], n.output[0])))
    probe = onnx.ModelProto()
    probe.CopyFrom(lowered)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                              for t in kinks if t not in known)
    got = ort_run(probe, fed)
    want = model.gradient(y, xs, zs, feeds=feeds, dy=dy).grads
    errors = {x: rel_l2(got[n], want[x]) for x, n in zip(xs, names)}
    round_off = 0
    if max(errors.values()) > L2_TOL:
        exact = model.gradient(y, xs, zs, feeds=feeds, dy=dy, dtype="float64").grads
        for x, n in zip(xs, names):
            own = np.linalg.norm(want[x].astype(np.float64) - exact[x])
            if errors[x] > L2_TOL and own > L2_TOL * np.linalg.norm(exact[x]):
                round_off += 1
                ours = np.linalg.norm(got[n].astype(np.float64) - exact[x])
                errors[x] = 0.0 if ours <= 2 * own + L2_TOL * np.linalg.norm(exact[x]) else errors[x]
    worst = max(errors.values())
    if worst <= L2_TOL:
        return Judged(worst, errors, round_off)
    flips = kink_flips(proto, got, model.run(feeds, outputs=kinks)) if kinks else 0
    if not flips:
        return Judged(worst, errors, round_off, problem=f"relative L2 {worst:.3g} > {L2_TOL:g} with no kink decided "
                                                         "differently")
    same = engine.load(lowered).run(fed, outputs=names)
    same_l2 = max(rel_l2(same[n], want[x]) for x, n in zip(xs, names))
    problem = "" if same_l2 <= L2_TOL else f"the engine on the lowered graph is {same_l2:.3g} from its own gradients"
    return Judged(worst, errors, round_off, flips, same_l2, problem)


def lower_real(case, exporter: str, cache: str | None = real_models.CACHE, dynamic: bool = False) -> RealLowering:
    """Lower, check and run one architecture; with `dynamic` (symbolic batch / sequence), the one lowered
    model also runs at a second input size."""
    from tests.lowering_checks import check_valid

    proto, model, y, xs, zs, feeds, dy = prepared(case, exporter, cache, dynamic)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    base = dict(name=case.name, exporter=exporter, opset=opset, nodes_forward=len(proto.graph.node), xs=len(xs))
    start = time.perf_counter()
    try:
        lowered = engine.lower(proto, y, xs, zs, dy=True, names=[f"grad_{i}" for i in range(len(xs))])
        seconds = time.perf_counter() - start
        check_valid(lowered)
    except Exception as exc:  # noqa: BLE001 - the survey reports every refusal, one line
        return RealLowering(**base, nodes_lowered=0, lower_s=0.0, worst_l2=float("nan"),
                            problem=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")
    runs = [(feeds, dy)]
    if dynamic:
        resized = other_size(feeds)
        shape = model.run(resized, outputs=[y])[y].shape
        runs.append((resized, np.random.default_rng(8).standard_normal(shape).astype(np.float32)))
    results = []
    for k, (fed, seed) in enumerate(runs):
        try:
            results.append(judge(model, proto, lowered, y, xs, zs, fed, seed))
        except Exception as exc:  # noqa: BLE001
            results.append(Judged(float("nan"), {}, problem=f"onnxruntime: {str(exc).strip().splitlines()[0][:300]}"))
        if k and results[-1].problem:
            results[-1] = Judged(**{**results[-1].__dict__, "problem": f"at a second input size: {results[-1].problem}"})
    first = results[0]
    return RealLowering(**base, nodes_lowered=len(lowered.graph.node), lower_s=seconds,
                        worst_l2=max(r.worst_l2 for r in results), kink_flips=sum(r.kink_flips for r in results),
                        same_forward_l2=max(r.same_forward_l2 for r in results),
                        round_off=first.round_off, problem="; ".join(r.problem for r in results if r.problem),
                        errors=first.errors)
