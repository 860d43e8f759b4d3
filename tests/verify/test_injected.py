"""Detection power: deliberately wrong VJPs registered through the custom-op API must be caught by
full and fast mode, and the per-node search must name the node that carries the bug."""
import numpy as np
import pytest
import torch
from onnx import helper

import engine
from engine.verify import register_op_with_vjp
from tests.verify_models import init, make, vi

N = 5  # square shapes, so that a transposed or wrongly reduced gradient still has the right shape


def _phi(x):
    return torch.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


def _Phi(x):
    return 0.5 * (1 + torch.erf(x / np.sqrt(2)))


# op, since, (input names of the bug node), forward, wrong vjp, correct vjp
BUGS = {
    "scaled_0.99": ("Tanh", 6, ["h"], lambda h: torch.tanh(h),
                    lambda g, i, o: (0.99 * g[0] * (1 - o[0] ** 2),),
                    lambda g, i, o: (g[0] * (1 - o[0] ** 2),)),
    "scaled_2": ("Mul", 7, ["h", "c"], lambda h, c: h * c,
                 lambda g, i, o: (2 * g[0] * i[1], g[0] * i[0]),
                 lambda g, i, o: (g[0] * i[1], g[0] * i[0])),
    "transposed": ("MatMul", 1, ["h", "c"], lambda h, c: h @ c,
                   lambda g, i, o: (g[0] @ i[1], i[0].transpose(-1, -2) @ g[0]),
                   lambda g, i, o: (g[0] @ i[1].transpose(-1, -2), i[0].transpose(-1, -2) @ g[0])),
    "missing_term": ("Gelu", 20, ["h"], lambda h: h * _Phi(h),
                     lambda g, i, o: (g[0] * _Phi(i[0]),),  # drops the x * phi(x) term
                     lambda g, i, o: (g[0] * (_Phi(i[0]) + i[0] * _phi(i[0])),)),
    "wrong_sign": ("Sub", 7, ["h", "c"], lambda h, c: h - c,
                   lambda g, i, o: (g[0], g[0]),
                   lambda g, i, o: (g[0], -g[0])),
    "wrong_broadcast_reduction": ("Add", 7, ["h", "b"], lambda h, b: h + b,
                                  lambda g, i, o: (g[0], g[0].sum(-1)),  # b is broadcast along rows: sum axis 0
                                  lambda g, i, o: (g[0], g[0].sum(-2))),
    "off_by_one_element": ("Exp", 13, ["h"], lambda h: torch.exp(h),
                           lambda g, i, o: (_drop_last(g[0] * o[0]),),
                           lambda g, i, o: (g[0] * o[0],)),
}


def _drop_last(t):
    """A loop that stops one element short: the last element gets no gradient."""
    mask = torch.ones(t.shape[-1], dtype=t.dtype, device=t.device)
    mask[-1] = 0
    return t * mask


def _model(op: str, inputs: list[str], opset: int):
    rng = np.random.default_rng(3)
    w1 = init("w1", (rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32))
    w2 = init("w2", (rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32))
    c = init("c", rng.standard_normal((N, N)).astype(np.float32))
    b = init("b", rng.standard_normal((N,)).astype(np.float32))
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="first"),
             helper.make_node(op, inputs, ["u"], name="bug"),
             helper.make_node("Gemm", ["u", "w2"], ["y"], name="last")]
    inits = [w1, w2] + ([c] if "c" in inputs else []) + ([b] if "b" in inputs else [])
    return make(nodes, [vi("x", [N, N])], [vi("y", [N, N])], inits, opset=max(opset, 17))


def _selection(inputs):
    return ["x"] + [n for n in inputs if n in ("c", "b")]


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_wrong_vjp_is_caught_and_the_node_named(bug, mode):
    op, since, inputs, forward, wrong, _ = BUGS[bug]
    with register_op_with_vjp(op, forward, lambda g, i, o: wrong(g, i, o), since=since):
        model = engine.load(_model(op, inputs, since))
        report = engine.check(model, "y", _selection(inputs), feeds={"x": np.random.default_rng(0).standard_normal((N, N))},
                              mode=mode)
    assert report.verdict == "fail", report.summary()
    assert report.first_failing_node == "bug", report.summary()
    failing_nodes = [n.node_name for n in report.nodes if n.status == "fail"]
    assert failing_nodes == ["bug"], report.summary()


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_same_op_with_a_correct_vjp_passes(bug):
    """The control: the custom-op machinery itself adds no error, so the failures above are the bugs."""
    op, since, inputs, forward, _, right = BUGS[bug]
    with register_op_with_vjp(op, forward, lambda g, i, o: right(g, i, o), since=since):
        model = engine.load(_model(op, inputs, since))
        report = engine.check(model, "y", _selection(inputs), feeds={"x": np.random.default_rng(0).standard_normal((N, N))},
                              mode="full", per_node=True)
    assert report.verdict == "pass", report.summary()
    assert all(n.status == "pass" for n in report.nodes)


def test_unregister_restores_the_builtin_op():
    before = engine.registry.lookup("", "Tanh", 17).fn
    handle = register_op_with_vjp("Tanh", torch.tanh, lambda g, i, o: (2 * g[0],), since=6)
    assert engine.registry.lookup("", "Tanh", 17).fn is not before
    handle.unregister()
    assert engine.registry.lookup("", "Tanh", 17).fn is before
    with pytest.raises(engine.OnnxGradError, match="no custom op"):
        engine.unregister_op("Tanh", since=6)


def test_custom_domain_op_with_attributes_runs_and_is_checked():
    def forward(a, *, alpha=1.0):
        return alpha * torch.sin(a)

    def vjp(grads, inputs, outputs, *, alpha=1.0):
        return (alpha * grads[0] * torch.cos(inputs[0]),)

    proto = make([helper.make_node("ScaledSin", ["x"], ["y"], name="ss", domain="com.example", alpha=3.0)],
                 [vi("x", [3, 4])], [vi("y", [3, 4])])
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    with register_op_with_vjp("ScaledSin", forward, vjp, domain="com.example"):
        model = engine.load(proto)
        x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], 3 * np.sin(x), rtol=1e-6)
        report = engine.check(model, "y", ["x"], feeds={"x": x}, order=2, per_node=True)
    assert report.verdict == "pass", report.summary()
    assert report.second_order and report.second_order[0].status == "pass"
    # Unregistered again: the model still opens, but nothing that reaches the op runs.
    with pytest.raises(engine.OnnxGradError, match="ScaledSin") as info:
        engine.load(proto).run({"x": x})
    assert "\n" not in str(info.value)
