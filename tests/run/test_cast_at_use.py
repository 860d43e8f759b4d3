"""Constants cast where a step reads them (engine/run/cast_at_use.py): a plan in another float dtype
keeps big weights in their own dtype and memory, autograd holds no cast copy, and the values are those
of converting every constant first."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import engine
from engine.run import cast_at_use
from engine.run import plan as plan_module
from tests.fusion_models import vit_block, vit_input


def _mlp(n=300, seed=0):
    """x [2, n] @ W1 [n, n] -> Tanh -> Gemm(W2, transB) -> y: two weights of n*n >= CAST_AT_USE elements."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    w2 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm"), helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
         helper.make_node("Gemm", ["t", "W2"], ["y"], name="gemm", transB=1)],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w1, w2


def test_a_float64_plan_holds_the_float32_weights_themselves():
    proto, w1, w2 = _mlp()
    model = engine.load(proto)
    plan = model.prepare(["x"], ["y"], dtype="float64")
    held = {plan.names[k]: v for k, v in enumerate(plan._template) if v is not None}
    assert held["W1"].dtype == torch.float32 and held["W2"].dtype == torch.float32
    assert held["W1"].data_ptr() == model.constants()["W1"].data_ptr()  # no copy: the model's own bytes
    assert {plan.names[k] for k in plan.cast_slots} == {"W1", "W2"}


@pytest.mark.parametrize("mode", ["interpret", "fx"])
def test_values_and_gradients_are_those_of_converting_first(mode, monkeypatch):
    monkeypatch.setattr(plan_module, "DEFAULT_MODE", mode)
    proto, w1, w2 = _mlp()
    model = engine.load(proto)
    x = np.random.default_rng(1).standard_normal((2, 300))
    for _ in range(3):  # the fx module is built on the second run
        got = model.gradient("y", ["x"], [], {"x": x}, dtype="float64")
    xt = torch.tensor(x, requires_grad=True)
    y = torch.tanh(xt @ torch.tensor(w1, dtype=torch.float64)) @ torch.tensor(w2, dtype=torch.float64).T
    (want,) = torch.autograd.grad(y.sum(), xt)
    np.testing.assert_allclose(got.grads["x"], want.numpy(), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(model.run({"x": x}, dtype="float64")["y"], y.detach().numpy(), rtol=1e-13, atol=1e-13)


def test_autograd_keeps_no_cast_copy(monkeypatch):
    """The forward's saved weights are packed as their float32 source: every float64 copy dies with its step."""
    copies = []
    made = cast_at_use.cast_one

    def recorded(source, dtype):
        out = made(source, dtype)
        if out is not source:
            copies.append(weakref.ref(out))
        return out

    monkeypatch.setattr(cast_at_use, "cast_one", recorded)
    monkeypatch.setattr(plan_module, "cast_args", lambda args, positions, dtype: [
        recorded(a, dtype) if j in positions else a for j, a in enumerate(args)])
    proto, w1, w2 = _mlp()
    model = engine.load(proto)
    plan = model.prepare(["x"], ["y"], dtype="float64")
    x = torch.randn(2, 300, dtype=torch.float64, requires_grad=True)
    (y,) = plan.interpret([x])
    gc.collect()
    assert len(copies) == 2 and all(c() is None for c in copies)  # held by nothing, autograd included
    (g,) = torch.autograd.grad(y.sum(), x)
    want = (1 - torch.tanh(x @ torch.tensor(w1, dtype=torch.float64)) ** 2) * (
        torch.ones(2, 300, dtype=torch.float64) @ torch.tensor(w2, dtype=torch.float64))
    torch.testing.assert_close(g, want @ torch.tensor(w1, dtype=torch.float64).T, rtol=1e-12, atol=1e-12)


def test_no_float32_constant_slips_into_fused_float64_steps(monkeypatch):
    """Every float constant cast at use (the threshold at 1): the fused attention and GELU steps read
    them as float64, so a float64 run of the float32 block equals the block built in float64 from the
    same float32 values, to float64 round-off."""
    monkeypatch.setattr(cast_at_use, "CAST_AT_USE", 1)
    proto = vit_block()
    model = engine.load(proto)
    plan = model.prepare(["x"], ["y"], dtype="float64")
    assert plan.cast_slots and any(getattr(s.fn, "fused", None) for s in plan.run_steps)
    wide = helper.make_model(proto.graph, opset_imports=proto.opset_import)
    for init in wide.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in wide.graph.node:
        for attr in node.attribute:
            if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float64), attr.t.name))
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
    for v in (*wide.graph.input, *wide.graph.output, *wide.graph.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    x = vit_input(dtype=np.float64)
    got = model.run({"x": x}, dtype="float64")["y"]
    want = engine.load(wide).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def _embedding(vocab=4096, d=32, seed=0):
    """ids -> Gather(E) -> MatMul(Transpose(E)) -> logits: GPT-2's tied embedding, E of vocab*d elements."""
    e = np.random.default_rng(seed).standard_normal((vocab, d)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"], name="wte"),
         helper.make_node("Transpose", ["E"], ["et"], name="tr", perm=[1, 0]),
         helper.make_node("MatMul", ["h", "et"], ["logits"], name="head")],
        "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, vocab])], [numpy_helper.from_array(e, "E")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), e


def test_a_lookup_casts_the_rows_it_takes_and_no_module_holds_a_cast_table(monkeypatch):
    monkeypatch.setattr(plan_module, "DEFAULT_MODE", "fx")
    proto, e = _embedding()
    model = engine.load(proto)
    ids = np.array([5, 17, 4000])
    plan = model.prepare(["ids"], ["logits"], dtype="float64")
    for _ in range(3):  # interpreted, then the fx module
        (got,) = plan.run([torch.tensor(ids)])
    e64 = e.astype(np.float64)
    np.testing.assert_allclose(got.numpy(), e64[ids] @ e64.T, rtol=1e-12, atol=1e-12)
    assert got.dtype == torch.float64
    held = [v for v in plan._fx["targets"].constants if isinstance(v, torch.Tensor)]
    assert held and not any(v.dtype == torch.float64 and v.numel() >= e.size for v in held)
    gather = next(s for s in plan.steps if s.op_type == "Gather")
    assert gather.cast == () and getattr(gather.fn, "no_fold", False)  # the rows are cast, not the table


def test_a_weight_differentiated_in_another_dtype_is_cast_per_call_and_not_kept():
    """W1 as x in a float64 gradient: its float64 copy lives as long as the call's result, as the plan's
    casts do; the explorer on GPT-2 kept the embedding's 0.29 GB copy for the rest of the session."""
    proto, w1, w2 = _mlp()
    model = engine.load(proto)
    x = np.random.default_rng(1).standard_normal((2, 300))
    first = model.gradient("y", ["W1"], ["x"], {"x": x}, dtype="float64")
    assert first.values["W1"].dtype == np.float64 and np.array_equal(first.values["W1"], w1.astype(np.float64))
    grads = first.grads["W1"].copy()
    del first
    gc.collect()
    copies = [v for v in gc.get_objects() if isinstance(v, torch.Tensor) and v.dtype == torch.float64
              and tuple(v.shape) == w1.shape]
    assert copies == []  # neither the model's constants nor its cached gradient call hold one
    np.testing.assert_array_equal(model.gradient("y", ["W1"], ["x"], {"x": x}, dtype="float64").grads["W1"], grads)
    assert not model.constants(dtype="float64").keeps("W1")
    assert model.constants().keeps("W1") and model.constants(dtype="float32").keeps("W1")  # the weight itself


def test_a_weight_asked_for_in_another_dtype_is_not_held_after_the_run():
    """The explorer's inspector asks `run(outputs=[weight])`: the cast copy is the caller's alone (a
    plan held it converted for as long as the plan was cached)."""
    proto, w1, w2 = _mlp()
    model = engine.load(proto)
    alone = model.run(outputs=["W1"], dtype="float64")["W1"]  # no feeds needed for a weight alone
    assert alone.dtype == np.float64 and np.array_equal(alone, w1.astype(np.float64))
    del alone
    gc.collect()
    assert not [v for v in gc.get_objects() if isinstance(v, torch.Tensor) and v.dtype == torch.float64
                and tuple(v.shape) == w1.shape]
    x = np.random.default_rng(1).standard_normal((2, 300))
    got = model.run({"x": x}, outputs=["W1", "y"], dtype="float64")  # with a value that reads it: the same
    assert got["W1"].dtype == np.float64 and np.array_equal(got["W1"], w1.astype(np.float64))
    np.testing.assert_allclose(got["y"], model.run({"x": x}, dtype="float64")["y"], rtol=0, atol=0)
    assert np.shares_memory(model.run(outputs=["W1"])["W1"], model.constants()["W1"].numpy())  # its own dtype: no copy
