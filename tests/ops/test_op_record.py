"""Each op's gradient knowledge in one record (engine.registry.record): forward, VJP needs, rule text,
lowering. Every differentiable built-in op has all four; a user's op written in one file runs, is
differentiated, lowered and described in the app; unregistering it leaves nothing behind."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import engine
from engine import registry
from engine.modelfile.contrib_schema import signature
from engine.opsfile import load_ops_file, registrations_undone

BUILTIN = "engine.ops."


def _builtin_ops() -> set[tuple[str, str]]:
    return {(e.domain, e.op_type) for e in registry.supported_ops() if e.fn.__module__.startswith(BUILTIN)}


def test_every_differentiable_builtin_op_has_forward_needs_rule_text_and_lowering():
    gaps = {}
    for domain, op in sorted(_builtin_ops() | set(registry._BUILTIN_DESCRIBED)):
        missing = registry.record(op, domain).gaps()
        if missing:
            gaps[f"{domain}::{op}" if domain else op] = ", ".join(missing)
    assert not gaps, ("ops lacking part of their gradient knowledge (write it on the @describe line above the "
                      "op's @register, or no_gradient=why; lowering: engine/lowering/<family>.py, or refuse(why)):\n"
                      + "\n".join(f"  {op}: {what}" for op, what in gaps.items()))


def _formal_inputs(domain: str, op: str) -> list[str] | None:
    try:
        return [i.name for i in onnx.defs.get_schema(op, domain).inputs]
    except onnx.defs.SchemaError:
        names = signature(domain, op)
        return list(names[0]) if names else None


def test_rule_lines_and_needs_fit_the_ops_inputs():
    """A rule has at most one line per formal input (a variadic last one repeats), and needs name positions
    the op has: a line shifted by one input would put the wrong text beside a tensor."""
    wrong = []
    for domain, op in sorted(_builtin_ops()):
        rec, formal = registry.record(op, domain), _formal_inputs(domain, op)
        if formal is None or not rec.differentiable:
            continue
        variants = rec.rule.values() if rec.rule_by else [rec.rule]
        if any(len(lines) > max(len(formal), 2) for lines in variants):  # (line, None) is any unary op's
            wrong.append(f"{op}: {max(len(v) for v in variants)} rule lines for inputs {formal}")
        far = [p for p in rec.needs or () if p.startswith("in") and p != "in" and int(p[2:]) >= len(formal)]
        if far:
            wrong.append(f"{op}: needs {far} beyond inputs {formal}")
    assert not wrong, "\n".join(wrong)


def test_a_forward_alone_shows_its_gaps_and_describe_refuses_nonsense():
    @registry.register("Bare", domain="com.example.gaps")
    def bare(x):
        return x

    try:
        rec = registry.record("Bare", "com.example.gaps")
        assert rec.gaps() == ("VJP needs", "rule text", "lowering or a reason it is refused")
        assert rec.validate is None and rec.jvp is None  # no validator declared; JVP left for a later issue
    finally:
        registry.remove("com.example.gaps", "Bare")
    assert registry.record("Bare", "com.example.gaps") is None
    with pytest.raises(ValueError, match="in0, out1"):
        registry.describe("Bare", domain="com.example.gaps", needs="x0", rule="dX = dY")
    with pytest.raises(ValueError, match="no_gradient"):
        registry.describe("Bare", domain="com.example.gaps", no_gradient="integers", rule="dX = dY")


def test_every_contrib_op_records_its_validator():
    """Each onnxruntime op that takes more than one shape checks its inputs (tests/ops/test_op_validation.py)."""
    from engine.modelfile.contrib_schema import SIGNATURES

    elementwise = {"Gelu", "QuickGelu"}  # one input of any shape: nothing to check
    missing = [op for (domain, op) in SIGNATURES if op not in elementwise
               and (registry.record(op, domain) is None or registry.record(op, domain).validate is None)]
    assert not missing, f"contrib ops without @validates: {missing}"
    gqa = registry.record("GroupQueryAttention", "com.microsoft")
    assert gqa.validate.__module__ == gqa.forwards[0].fn.__module__  # beside its forward


def test_a_validator_runs_before_the_forward_in_every_path_and_goes_with_its_op():
    """The interpreter (first run) and the fx module (later runs, new shapes) both call it, once per
    signature of input shapes; the error names the node; unregistering the op drops it."""
    from engine.errors import InputShapeError

    seen = []

    @registry.register("Paired", domain="com.example.checked")
    def paired(a, b):
        seen.append("forward")
        return a + b

    @registry.validates("Paired", domain="com.example.checked")
    def paired_inputs(ins, **_):
        seen.append("validate")
        ins.dim("in1", -1, ins.shape("in0")[-1], "in0's last dim")

    graph = helper.make_graph(
        [helper.make_node("Paired", ["A", "B"], ["Y"], name="pair", domain="com.example.checked")], "checked",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", "m"]) for n in "AB"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", "m"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example.checked", 1)])
    try:
        assert registry.record("Paired", "com.example.checked").validate is paired_inputs
        model = engine.load(proto)
        ones = np.ones((2, 3), np.float32)
        for _ in range(3):  # the first run interprets, the later ones run the fx module
            model.run({"A": ones, "B": ones})
        assert seen == ["validate", "forward", "forward", "forward"]  # once per signature of input shapes
        model.run({"A": ones[:1], "B": ones[:1]})
        assert seen[-2:] == ["validate", "forward"]
        with pytest.raises(InputShapeError, match=r"^node 'pair' \(Paired\): input 'in1' of shape \[2, 4\]: "
                                                  r"dim 1 is 4, expected 3 \(in0's last dim\)$"):
            model.run({"A": ones, "B": np.ones((2, 4), np.float32)})
        assert seen[-1] == "validate"
    finally:
        registry.remove("com.example.checked", "Paired")
    assert registry.validator("com.example.checked", "Paired") is None


def test_records_link_each_kind_of_lowering():
    kinds = {op: registry.record(op, domain).lowering for domain, op in [
        ("", "Sin"), ("", "RoiAlign"), ("", "SoftmaxCrossEntropyLoss"), ("com.microsoft", "FastGelu"),
        ("com.microsoft", "Attention"), ("", "Upsample")]}
    assert kinds["Sin"].kind == "rule" and kinds["Sin"].fn is engine.lowering.BACKWARD["Sin"]
    assert kinds["RoiAlign"].kind == "refused" and "rois" in kinds["RoiAlign"].detail
    assert kinds["SoftmaxCrossEntropyLoss"].kind == "function body"
    assert kinds["FastGelu"].kind == "expansion" and kinds["Upsample"].kind == "expansion"
    assert (kinds["Attention"].kind, kinds["Attention"].detail) == ("expansion", "engine.lowering.contrib_fused.attention")


# --- a user's op in one file -------------------------------------------------------------------------
OPS_FILE = '''"""com.example::SinSquare in one file: forward, rule text, VJP needs and lowering."""
import torch

from engine.lowering.registry import expansion
from engine.registry import describe, register


@describe("SinSquare", domain="com.example", needs="in0", rule="dX = dY · (2·X + cos(X))")
@register("SinSquare", domain="com.example")
def sin_square(x):
    return x * x + torch.sin(x)


@expansion("SinSquare", domain="com.example")
def sin_square_onnx(ctx, node):
    x = node.input[0]
    ctx.emit("Add", [ctx.op("Mul", [x, x]), ctx.op("Sin", [x])], [node.output[0]])
'''
RULE = "dX = dY · (2·X + cos(X))"


def _sin_square_model() -> onnx.ModelProto:
    """Y = SinSquare(X) · X: the op's gradient and its input's other use meet at X."""
    graph = helper.make_graph(
        [helper.make_node("SinSquare", ["X"], ["S"], name="sq", domain="com.example"),
         helper.make_node("Mul", ["S", "X"], ["Y"], name="mul")], "one_file_op",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def _torch_reference(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = (t * t + torch.sin(t)) * t
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return y.detach().numpy(), t.grad.numpy()


def test_an_op_written_in_one_file_runs_differentiates_lowers_and_is_described(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from explorer.rules import GENERIC, rule_lines
    from explorer.stepper import trace

    path = tmp_path / "sin_square_ops.py"
    path.write_text(OPS_FILE, encoding="utf-8")
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    want_y, want_dx = _torch_reference(x, dy)
    proto = _sin_square_model()
    with registrations_undone():
        assert load_ops_file(str(path)) == ("com.example::SinSquare",)
        rec = registry.record("SinSquare", "com.example")
        assert rec.gaps() == () and rec.rule == (RULE, None) and rec.needs == ("in0",)
        assert rec.lowering.kind == "expansion"
        model = engine.load(proto)

        # run and differentiate: torch autograd on the same formula, and central differences
        np.testing.assert_allclose(model.run({"X": x})["Y"], want_y, rtol=1e-5, atol=1e-6)
        got = model.gradient("Y", ["X"], feeds={"X": x}, dy=dy).grads["X"]
        np.testing.assert_allclose(got, want_dx, rtol=1e-5, atol=1e-5)
        x64, h = x.astype(np.float64), 1e-6
        fd = np.zeros_like(x64)
        for i in np.ndindex(x.shape):
            step = np.zeros_like(x64)
            step[i] = h
            up, down = (model.run({"X": x64 + s}, dtype="float64")["Y"] for s in (step, -step))
            fd[i] = np.sum(dy * (up - down)) / (2 * h)
        np.testing.assert_allclose(got, fd, rtol=1e-4, atol=1e-4)

        # lowered: plain ai.onnx ops onnxruntime runs, the same values
        lowered = engine.lower(model, y="Y", xs=["X"], dy=True)
        assert {n.domain for n in lowered.graph.node} <= {"", "ai.onnx"}
        session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"X": x, "dY": dy})))
        np.testing.assert_allclose(out["Y"], want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["dY_dX"], want_dx, rtol=1e-5, atol=1e-5)

        # described in the app: the inspector's rule lines, step mode's frame, the backward view's needs
        node = proto.graph.node[0]
        assert rule_lines(node, 1) == [("X", RULE)]
        frame = next(f for f in trace(model, model.selection("Y", ["X"]), {"X": x}).frames
                     if f.phase == "reverse" and f.op_type == "SinSquare")
        assert [(o.symbol, o.tensor, o.rule) for o in frame.outgoing] == [("X", "X", RULE)]
        backward = engine.build_backward_graph(model, model.selection("Y", ["X"]))
        assert {n.op_type: n.needs for n in backward.nodes if n.kind == "backward"} == {"SinSquare": ("X",),
                                                                                       "Mul": ("S", "X")}
    # unregistered with the block: no forward, no description, no expansion left
    assert registry.record("SinSquare", "com.example") is None
    assert ("com.example", "SinSquare") not in engine.lowering.registry.EXPANDED
    assert rule_lines(node, 1) == [("input0", GENERIC.format(input="input0", op="SinSquare"))]


def test_unregistering_a_custom_op_drops_its_description_and_restores_a_builtin_one():
    relu = registry.record("Relu")
    handle = engine.register_op_with_vjp("Tripled", lambda x: 3 * x, lambda g, i, o: (3 * g[0],), domain="com.example")
    registry.describe("Tripled", domain="com.example", needs="", rule="dX = 3 · dY")
    engine.register_op_with_vjp("Relu", lambda x: x.clamp(min=0), lambda g, i, o: (g[0] * (i[0] > 0),))
    registry.describe("Relu", needs="in0", rule="dX = dY · (X > 0)   # mine")
    try:
        assert registry.record("Tripled", "com.example").rule == ("dX = 3 · dY", None)
        assert registry.record("Relu").rule == ("dX = dY · (X > 0)   # mine", None)
    finally:
        engine.unregister_op("Tripled", domain=handle.domain)
        engine.unregister_op("Relu")
    assert registry.record("Tripled", "com.example") is None
    assert registry.record("Relu").rule == relu.rule and registry.record("Relu").forwards == relu.forwards
