"""Plan fusion (engine/run/fusion.py): fused GELU/attention against the same plan unfused, forward and
gradients; the tensors that must stop a fusion; patterns that differ; fx vs interpreter."""
import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import engine
from engine.gradient.prepared import PreparedGradient
from engine.run.plan import Plan, StepObserver
from tests.fusion_models import ATTENTIONS, GELUS, vit_block, vit_input
from tests.run.test_fxplan import assert_fx_matches_interpreter, assert_gradients_identical

CPU = torch.device("cpu")
WEIGHTS = ["wq", "wk", "wv", "w1", "w2"]


def fused_ops(plan) -> list[str]:
    return sorted(s.op_type for s in plan.run_steps if s.op_type.startswith("Fused"))


def plan_pair(model, sources, targets, dtype=None):
    """The plan as `Model` builds it (fusing) and the same plan with fusion off."""
    kw = dict(device=CPU, float_dtype=dtype, constants=model.constants(CPU, dtype))
    return (Plan(model.graph, sources, targets, **kw, fuse=True),
            Plan(model.graph, sources, targets, **kw, fuse=False))


def gradients(model, plan, x: np.ndarray, dtype=None):
    """y and dy/d(x, every weight) through `plan`, with a fixed random dy."""
    spec = model.selection("y", ["x"] + WEIGHTS)
    consts = model.constants(CPU, dtype)
    values = [model.to_tensor("x", x, CPU, dtype)] + [consts[w] for w in WEIGHTS]
    out = PreparedGradient(spec, plan)(*values, dy=lambda y: torch.randn(
        y.shape, generator=torch.Generator().manual_seed(3)).to(y.dtype))
    return [out.y, *out.grads]


def assert_close_to_unfused(model, x, dtype, rtol, fused_as=("FusedAttention", "FusedGelu")):
    """y and every gradient within `rtol` of the chain's, relative to its largest element plus a
    1e-2 share of the largest of all (as bench_real judges): a gradient that cancels to a small
    value carries the round-off of its larger terms, and the fused kernels sum in another order."""
    fused, plain = plan_pair(model, ["x", *WEIGHTS], ["y"], dtype)
    assert fused_ops(fused) == list(fused_as) and fused_ops(plain) == []
    got, want = gradients(model, fused, x, dtype), gradients(model, plain, x, dtype)
    overall = max(float(b.abs().max()) for b in want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        scale = float(b.abs().max()) + 1e-2 * overall
        assert float((a - b).abs().max()) <= rtol * scale, float((a - b).abs().max()) / scale


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("gelu", GELUS)
@pytest.mark.parametrize("constants", ["init", "node"])
def test_fused_values_and_gradients_match_the_chain(gelu, attention, constants):
    model = engine.load(vit_block(gelu=gelu, attention=attention, constants=constants))
    assert_close_to_unfused(model, vit_input(), None, 2e-6)
    wide = engine.load(vit_block(gelu=gelu, attention=attention, constants=constants, elem=TensorProto.DOUBLE))
    assert_close_to_unfused(wide, vit_input(dtype=np.float64), None, 1e-13)


def test_a_float64_run_of_float32_constants_keeps_the_gelu_chain():
    """float32's sqrt 2 is not float64's: fusing would change the 8th digit, so only attention fuses."""
    model = engine.load(vit_block())
    assert_close_to_unfused(model, vit_input(), torch.float64, 1e-13, fused_as=("FusedAttention",))


def test_fused_forward_agrees_with_onnxruntime():
    proto = vit_block()
    model, x = engine.load(proto), vit_input()
    (want,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    got = model.run({"x": x})["y"]
    assert fused_ops(model.prepare(["x"], ["y"])) == ["FusedAttention", "FusedGelu"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), s=st.integers(1, 7), heads=st.integers(1, 3), dh=st.integers(1, 6),
       hidden=st.integers(1, 12), gelu=st.sampled_from(GELUS), attention=st.sampled_from(ATTENTIONS),
       seed=st.integers(0, 2 ** 16))
def test_any_shape_matches_the_chain(b, s, heads, dh, hidden, gelu, attention, seed):
    model = engine.load(vit_block(b=b, s=s, heads=heads, dh=dh, hidden=hidden, gelu=gelu, attention=attention,
                                  seed=seed))
    # float32: 1.1e-5 at worst over 400 random blocks (tiny heads cancel most), so 5e-5
    assert_close_to_unfused(model, vit_input(b, s, heads * dh, seed + 1), None, 5e-5)
    wide = engine.load(vit_block(b=b, s=s, heads=heads, dh=dh, hidden=hidden, gelu=gelu, attention=attention,
                                 seed=seed, elem=TensorProto.DOUBLE))
    assert_close_to_unfused(wide, vit_input(b, s, heads * dh, seed + 1, np.float64), None, 1e-12)


def assert_exactly_unfused(model, sources, targets, feeds, tensor=None):
    """Nothing fused, and the values are the unfused plan's bit for bit; or, with `tensor` given,
    a fused step only where `tensor` is one of its inputs (a fed q may start an attention)."""
    fused, plain = plan_pair(model, sources, targets)
    for step in fused.run_steps:
        if step.op_type.startswith("Fused"):
            assert tensor is not None and tensor in [fused.names[k] for k in step.in_slots]
    values = [model.to_tensor(n, feeds[n], CPU, None) for n in sources]
    with torch.no_grad():
        for a, b in zip(fused.interpret(values), plain.interpret(values)):
            assert torch.equal(a, b) if not fused_ops(fused) else torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tensor, pattern", [("erf", "FusedGelu"), ("u", "FusedGelu"), ("hu", "FusedGelu"),
                                             ("h_scaled", "FusedGelu"), ("p", "FusedAttention"),
                                             ("scores", "FusedAttention"), ("q_scaled", "FusedAttention")])
def test_a_requested_fed_read_or_output_tensor_inside_a_pattern_stops_it(tensor, pattern):
    only = dict(attention="skip") if pattern == "FusedGelu" else dict(gelu="skip")  # the other one never fuses
    model, x = engine.load(vit_block(**only)), vit_input()
    assert fused_ops(model.prepare(["x"], ["y"])) == [pattern]
    inside = model.run({"x": x}, outputs=[tensor])[tensor]
    assert_exactly_unfused(model, ["x"], ["y", tensor], {"x": x})  # a target
    assert_exactly_unfused(model, ["x", tensor], ["y"], {"x": x, tensor: inside}, tensor)  # a source
    assert_exactly_unfused(engine.load(vit_block(leak=tensor, **only)), ["x"], ["y"], {"x": x})  # read outside
    assert_exactly_unfused(engine.load(vit_block(expose=tensor, **only)), ["x"], ["y"], {"x": x})  # an output


def test_gradient_with_an_inside_tensor_selected_is_the_unfused_one():
    """xs = the attention scores: Softmax and the last MatMul stay in the plan, unfused."""
    model, x = engine.load(vit_block(gelu="skip")), vit_input()
    feeds = model.run({"x": x}, outputs=["scores", "v"])
    got = model.gradient("y", ["scores"], ["v"], feeds=feeds)
    assert fused_ops(model.prepare_gradient("y", ["scores"], ["v"]).plan) == []
    plain = Plan(model.graph, ["scores", "v"], ["y"], device=CPU, float_dtype=None, constants=model.constants(),
                 fuse=False)
    want = PreparedGradient(model.selection("y", ["scores"], ["v"]), plain)(
        *[torch.from_numpy(feeds[n]) for n in ("scores", "v")])
    assert np.array_equal(got.grads["scores"], want.grads[0].numpy()) and np.array_equal(got.y, want.y.numpy())


@pytest.mark.parametrize("change, pattern", [
    (dict(mask=True), "FusedAttention"), (dict(axis=1), "FusedAttention"), (dict(half=0.49), "FusedGelu")])
def test_a_pattern_that_differs_does_not_fuse(change, pattern):
    only = dict(attention="skip") if pattern == "FusedGelu" else dict(gelu="skip")
    model, x = engine.load(vit_block(**change, **only)), vit_input()
    assert_exactly_unfused(model, ["x"], ["y"], {"x": x})


def test_a_dynamic_scale_is_never_taken_for_a_constant():
    """A scale computed from x's values stays its own Mul step: the fused attention reads its output."""
    model, x = engine.load(vit_block(dynamic_scale=True)), vit_input()
    fused, plain = plan_pair(model, ["x"], ["y"])
    assert any(s.op_type == "Mul" and fused.names[s.in_slots[1]] == "scale" for s in fused.run_steps)
    assert_close_to_unfused(model, x, torch.float64, 1e-13, fused_as=("FusedAttention",))


def test_a_kernel_that_declines_replays_the_chain_exactly():
    """In float16 both patterns match but the kernels decline (ONNX rounds half types step by
    step): the fused steps run the original nodes, so the values are the unfused plan's bit for bit."""
    model, x = engine.load(vit_block()), vit_input()
    fused, plain = plan_pair(model, ["x", *WEIGHTS], ["y"], torch.float16)
    assert fused_ops(fused) == ["FusedAttention", "FusedGelu"]
    for a, b in zip(gradients(model, fused, x, torch.float16), gradients(model, plain, x, torch.float16)):
        assert torch.equal(a, b)


def test_every_value_and_every_node_stay_visible():
    """keep_all plans do not fuse; run_all, run_observed (step mode, recorders) walk node by node."""
    model, x = engine.load(vit_block()), vit_input()
    assert model.prepare(["x"], ["y"], keep_all=True).run_steps == model.prepare(["x"], ["y"], keep_all=True).steps
    plan = model.prepare(["x"], ["y"])
    assert fused_ops(plan) and len(plan.steps) == len(model.graph.nodes)
    values = [torch.from_numpy(x)]
    everything = plan.run_all(values)
    assert {"erf", "u", "p", "scores"} <= everything.keys()
    unfused = plan_pair(model, ["x"], ["y"])[1].interpret_all(values)
    assert all(torch.equal(v, unfused[k]) for k, v in everything.items())

    class Seen(StepObserver):
        def __init__(self):
            self.ops = []

        def outputs(self, step, args, names, outs):
            self.ops.append(step.op_type)
            return outs

    seen = Seen()
    plan.run_observed(values, seen)
    assert len(seen.ops) == len(model.graph.nodes) and "Erf" in seen.ops and "Softmax" in seen.ops


def test_fusion_can_be_turned_off(monkeypatch):
    from engine.run import plan as plan_module

    monkeypatch.setattr(plan_module, "FUSE", False)
    model = engine.load(vit_block())
    plan = model.prepare(["x"], ["y"])
    assert plan.run_steps is plan.steps


def test_fx_matches_the_interpreter_on_fused_plans():
    model, x = engine.load(vit_block()), vit_input()
    plan = model.prepare(["x"], ["y"])
    assert fused_ops(plan)
    assert_fx_matches_interpreter(plan, [torch.from_numpy(x)])
    assert_gradients_identical(model, "y", ["x", *WEIGHTS], (), [torch.from_numpy(x)]
                               + [model.constants()[w] for w in WEIGHTS])


def test_second_order_gradients_run_unfused():
    """Flash attention's backward is not differentiable again: create_graph runs node by node."""
    model = engine.load(vit_block(elem=TensorProto.DOUBLE))
    x = torch.from_numpy(vit_input(dtype=np.float64)).requires_grad_()
    prepared = model.prepare_gradient("y", ["x"])
    assert fused_ops(prepared.plan)
    (g,) = prepared(x, create_graph=True).grads
    (hv,) = torch.autograd.grad(g.sum(), x)
    plain = PreparedGradient(model.selection("y", ["x"]), plan_pair(model, ["x"], ["y"])[1])
    (g2,) = plain(x, create_graph=True).grads
    assert torch.equal(hv, torch.autograd.grad(g2.sum(), x)[0])


def test_a_kernel_that_raises_leaves_the_answer_to_the_chain(monkeypatch):
    from engine.run import fusion

    def refuse(*args, **kwargs):
        raise RuntimeError("not on this build")

    monkeypatch.setattr(fusion.F, "scaled_dot_product_attention", refuse)
    model, x = engine.load(vit_block(gelu="skip")), vit_input()
    fused, plain = plan_pair(model, ["x", *WEIGHTS], ["y"])
    assert fused_ops(fused) == ["FusedAttention"]
    for a, b in zip(gradients(model, fused, x), gradients(model, plain, x)):
        assert torch.equal(a, b)
