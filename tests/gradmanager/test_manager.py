"""GradManager against MegEngine's documented semantics (seed 003) and against the MLP written directly in torch."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import engine
from engine import FeedError, GradManager, OnnxGradError, RecordingError, SelectionError

MLP = "sample_models/mlp.onnx"
PARAMS = ("W1", "b1", "W2", "b2")
_PROTO = onnx.load(MLP)
_INIT = {t.name: numpy_helper.to_array(t) for t in _PROTO.graph.initializer}
_SHARED_MODEL = engine.load(MLP)  # hypothesis examples cannot take a pytest fixture


def torch_params() -> dict[str, torch.Tensor]:
    return {n: torch.tensor(_INIT[n], dtype=torch.float64, requires_grad=True) for n in PARAMS}


def torch_mlp(p, X, T) -> dict[str, torch.Tensor]:
    """sample_models/mlp.onnx, written directly in torch."""
    H1 = X @ p["W1"] + p["b1"]
    logits = torch.relu(H1) @ p["W2"] + p["b2"]
    loss = (T * torch.log_softmax(logits, dim=1)).sum() * float(_INIT["neg_inv_batch"])
    return {"H1": H1, "logits": logits, "loss": loss}


def batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal((4, 8)), np.eye(3)[g.integers(0, 3, 4)]


def torch_grads(y: str, names, seeds, dy=None) -> dict[str, torch.Tensor]:
    """Sum over batches of d(dy·y)/d(names), from the torch MLP; names may include X and H1."""
    total: dict[str, torch.Tensor] = {}
    for s in seeds:
        X, T = (torch.tensor(a) for a in batch(s))
        X.requires_grad_()
        p = torch_params()
        out = torch_mlp(p, X, T)
        wrt = {**p, "X": X, "H1": out["H1"]}
        seed = torch.ones_like(out[y]) if dy is None else torch.as_tensor(dy)
        for n, g in zip(names, torch.autograd.grad(out[y], [wrt[n] for n in names], seed)):
            total[n] = total.get(n, 0) + g
    return total


def feeds(seed: int) -> dict[str, np.ndarray]:
    X, T = batch(seed)
    return {"X": X, "T": T}


def close(a, b, tol=1e-12) -> None:
    np.testing.assert_allclose(torch.as_tensor(a).detach().numpy(), torch.as_tensor(b).detach().numpy(),
                               rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def model():
    return engine.load(MLP)


def manager(model, attach=PARAMS, **kw) -> GradManager:
    return GradManager(model, dtype="float64", **kw).attach(list(attach))


# --- backward, accumulation, dy ---------------------------------------------------------------------
def test_backward_matches_torch_and_returns_recorded_outputs(model):
    gm = manager(model)
    with gm:
        out = gm.run(feeds(1))
        gm.backward("loss")
    ref = torch_grads("loss", PARAMS, [1])
    assert sorted(gm.grad) == sorted(PARAMS)
    for n in PARAMS:
        close(gm.grad[n], ref[n])
        assert gm.grad[n] is gm.params[n].grad  # where torch.optim looks
    X, T = (torch.tensor(a) for a in batch(1))
    close(out["logits"], torch_mlp(torch_params(), X, T)["logits"])
    assert not gm.recording and not gm.params.recorders


def test_gradients_accumulate_across_two_backward_calls_until_zero_grad(model):
    gm = manager(model)
    for s in (2, 3):
        gm.record()
        gm.run(feeds(s))
        gm.backward("loss")
    ref = torch_grads("loss", PARAMS, [2, 3])
    one = torch_grads("loss", PARAMS, [2])
    for n in PARAMS:
        close(gm.grad[n], ref[n])
        assert not torch.allclose(gm.grad[n], one[n])  # the second call really added
    gm.zero_grad(["W1"])
    assert "W1" not in gm.grad and "b1" in gm.grad
    gm.zero_grad()
    assert len(gm.grad) == 0 and gm.grad.get("W2") is None


def test_dy_for_non_scalar_y_and_the_default_ones(model):
    dy = np.random.default_rng(7).standard_normal((4, 3))
    gm = manager(model)
    with gm:
        gm.run(feeds(4))
        gm.backward("logits", dy)
    ref = torch_grads("logits", PARAMS, [4], dy=dy)
    for n in PARAMS:
        close(gm.grad[n], ref[n])
    gm.zero_grad()
    with gm:
        gm.run(feeds(4))
        gm.backward("logits")  # dy defaults to ones, as MegEngine's ones_like(y)
    close(gm.grad["W2"], torch_grads("logits", ["W2"], [4], dy=np.ones((4, 3)))["W2"])


def test_list_forms_and_torch_tensors_as_y(model):
    dy = np.random.default_rng(8).standard_normal((4, 3))
    gm = manager(model)
    with gm:
        out = gm.run(feeds(5))
        gm.backward(["loss", out["logits"]], [torch.tensor(2.0), dy])
    two_loss = torch_grads("loss", PARAMS, [5], dy=2.0)
    logits = torch_grads("logits", PARAMS, [5], dy=dy)
    for n in PARAMS:
        close(gm.grad[n], two_loss[n] + logits[n])
    gm.zero_grad()
    with gm:
        gm.run(feeds(5))
        gm.backward(["logits"], [dy])  # a one-element list form
    for n in PARAMS:
        close(gm.grad[n], logits[n])
    with pytest.raises(FeedError, match="dy must be a list too"):
        with gm:
            gm.run(feeds(5))
            gm.backward(["logits"], dy)


def test_a_loss_written_in_torch_on_two_recorded_runs(model):
    gm = manager(model)
    with gm:
        a, b = gm.run(feeds(6)), gm.run(feeds(7))
        gm.backward((a["logits"] ** 2).mean() + b["loss"])
    p = torch_params()
    X6, T6 = (torch.tensor(v) for v in batch(6))
    X7, T7 = (torch.tensor(v) for v in batch(7))
    y = (torch_mlp(p, X6, T6)["logits"] ** 2).mean() + torch_mlp(p, X7, T7)["loss"]
    for n, g in zip(PARAMS, torch.autograd.grad(y, [p[n] for n in PARAMS])):
        close(gm.grad[n], g)


# --- callbacks -----------------------------------------------------------------------------------
def test_callbacks_chain_in_attach_order_and_overlapping_attaches_compose(model):
    calls = []

    def f(name, g):
        calls.append(("f", name))
        return 2 * g

    def h(name, g):
        calls.append(("h", name))
        return g + 1

    gm = GradManager(model, dtype="float64")
    gm.attach(["W2", "b2"], callbacks=[f]).attach(["b2"], callbacks=h)  # b2: f then h
    assert gm.attached == {"W2": (f,), "b2": (f, h)}
    with gm:
        gm.run(feeds(9))
        gm.backward("loss")
    ref = torch_grads("loss", ["W2", "b2"], [9])
    close(gm.grad["W2"], 2 * ref["W2"])
    close(gm.grad["b2"], 2 * ref["b2"] + 1)  # h(f(g)), not f(h(g)) = 2g + 2
    assert calls.index(("f", "b2")) < calls.index(("h", "b2")) and len(calls) == 3
    gm.attach("b2", callbacks=[f])  # the seed's warning: re-attaching grows the chain
    assert gm.attached["b2"] == (f, h, f)


def test_callback_must_return_a_tensor_of_the_gradient_shape(model):
    gm = GradManager(model).attach("W1", callbacks=lambda name, g: None)
    with pytest.raises(OnnxGradError, match="returned NoneType; it must return a tensor of shape") as err:
        with gm:
            gm.run()
            gm.backward("loss")
    assert "\n" not in str(err.value) and not gm.recording and "W1" not in gm.grad
    with pytest.raises(OnnxGradError, match="is not callable"):
        gm.attach("b1", callbacks=[3])


# --- what gets a gradient ----------------------------------------------------------------------------
def test_attached_names_y_does_not_reach_keep_their_gradient_and_skip_callbacks(model):
    seen = []
    gm = GradManager(model, dtype="float64").attach(["W1", "W2"], callbacks=lambda n, g: seen.append(n) or g)
    with gm:
        gm.run(feeds(10), outputs=["H1", "loss"])
        gm.backward("H1")
    assert "W1" in gm.grad and "W2" not in gm.grad and seen == ["W1"]  # MegEngine's test_no_dependency


def test_with_only_parameters_attached_every_value_of_the_run_can_be_y():
    """Such runs go through the plan's compiled module (from the second run on), not the per-node
    tape; every value is still filed by name, so y may be an intermediate no output lists."""
    gm = GradManager(engine.load(MLP), dtype="float64").attach(["W1", "b1"])
    for seed in (20, 21, 22):
        with gm:
            gm.run(feeds(seed))
            gm.backward("H1")
    ref = torch_grads("H1", ["W1", "b1"], [20, 21, 22])
    for n in ("W1", "b1"):
        close(gm.grad[n], ref[n])


def test_an_attached_intermediate_gets_its_gradient_without_cutting_the_graph(model):
    gm = manager(model, attach=["W1", "H1", "b1"])
    with gm:
        out = gm.run(feeds(11), outputs=["loss", "H1"])
        gm.backward("loss")
    ref = torch_grads("loss", ["W1", "H1", "b1"], [11])
    for n in ("W1", "H1", "b1"):
        close(gm.grad[n], ref[n])  # W1 still receives gradient through H1
    # and dloss/dH1 is the Gradient operator's gradient w.r.t. the intermediate H1
    spec = model.gradient("loss", ["H1"], feeds={"H1": out["H1"].detach().numpy(), "T": feeds(11)["T"]},
                          dtype="float64")
    close(gm.grad["H1"], spec.grads["H1"])


def test_intermediates_with_fan_out_and_a_residual_path():
    """residual_fanout: H = X@W, loss = sum((tanh(H)@W + X)^2): W and X are read twice."""
    m = engine.load("sample_models/residual_fanout.onnx")
    gm = GradManager(m, dtype="float64").attach(["X", "W", "H"])
    with gm:
        out = gm.run(outputs=["loss", "H"])
        gm.backward("loss")
    init = {t.name: torch.tensor(numpy_helper.to_array(t), dtype=torch.float64, requires_grad=True)
            for t in onnx.load("sample_models/residual_fanout.onnx").graph.initializer}
    X, W = init["X"], init["W"]
    H = X @ W
    loss = ((torch.tanh(H) @ W + X) ** 2).sum()
    for n, g in zip(("X", "W", "H"), torch.autograd.grad(loss, [X, W, H])):
        close(gm.grad[n], g)  # both uses of W and X counted; nothing cut at H
    close(out["H"], H)


def test_an_input_attached_while_recording_is_temporary(model):
    gm = manager(model, attach=["W1"])
    for s in (12, 13):
        with gm:
            gm.attach("X")
            assert "X" in gm.attached
            gm.run(feeds(s))
            gm.backward("loss")
        assert "X" not in gm.attached  # gone with its recording, like a weakly referenced tensor
        close(gm.grad["X"], torch_grads("loss", ["X"], [s])["X"])  # a new tensor: starts empty
    close(gm.grad["W1"], torch_grads("loss", ["W1"], [12, 13])["W1"])  # persistent: accumulates
    persistent = GradManager(model, dtype="float64").attach("X")  # attached outside a recording: stays
    for s in (12, 13):
        with persistent:
            persistent.run(feeds(s))
            persistent.backward("loss")
    close(persistent.grad["X"], torch_grads("loss", ["X"], [12, 13])["X"])


# --- higher order ---------------------------------------------------------------------------------
def test_second_order_via_two_managers(model):
    outer = manager(model, attach=["W2"])
    inner = GradManager(model, params=outer.params).attach(["W2"])
    v = torch.tensor(np.random.default_rng(14).standard_normal((16, 3)))
    with outer:
        with inner:
            inner.run(feeds(14))
            inner.backward("loss")  # recorded by outer, which started earlier
        g = outer.grad["W2"]
        assert g.grad_fn is not None
        outer.backward(g, v)  # accumulates H·v onto g, as MegEngine's test_2nd_grad_with_manager
    p = torch_params()
    X, T = (torch.tensor(a) for a in batch(14))
    (g_ref,) = torch.autograd.grad(torch_mlp(p, X, T)["loss"], [p["W2"]], create_graph=True)
    (hv,) = torch.autograd.grad(g_ref, [p["W2"]], v)
    close(outer.grad["W2"], g_ref + hv)
    assert outer.grad["W2"].grad_fn is None  # nobody records any more: no graph kept alive


def test_backward_through_the_models_own_gradient_nodes():
    """spec_second_order computes dO/dW with a Gradient node, then differentiates sum(dO/dW) again in a
    second one: a GradManager backward from dO_dW must give that second node's outputs."""
    m = engine.load("sample_models/spec_second_order.onnx")
    gm = GradManager(m, dtype="float64").attach(["W", "X"])
    with gm:
        gm.run()
        gm.backward("dO_dW")
    want = m.run(dtype="float64")
    close(gm.grad["W"], want["d2O_dW2"])
    close(gm.grad["X"], want["d_dO_dW_dX"])


def test_an_inner_manager_does_not_see_the_outer_managers_backward(model):
    outer = manager(model, attach=["W2"])
    inner = GradManager(model, params=outer.params).attach(["W2"])
    with outer:
        with inner:
            outer.run(feeds(15))
            outer.backward("loss")
            g = outer.grad["W2"].clone()
            inner.backward(outer.grad["W2"])  # MegEngine's test_grad_manager_visibility_by_order
    close(outer.grad["W2"], g)


# --- errors: one line each ---------------------------------------------------------------------------
def int_model():
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Shape", ["X"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["X", "W"], ["Y"])],
        "ints", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("f", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "W")])
    return engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("action, error, message", [
    (lambda gm: gm.backward("loss"), RecordingError, "nothing recorded: call gm.record"),
    (lambda gm: (gm.record(), gm.record()), RecordingError, "already recording: it records one history"),
    (lambda gm: gm.attach(["W1", "W9"]), SelectionError, "attached name 'W9' is not a tensor of this model"),
    (lambda gm: (gm.record(), gm.run(), gm.backward("los")), SelectionError, "y 'los' is not a tensor.*did you mean"),
    (lambda gm: (gm.record(), gm.run(outputs="H1"), gm.backward("loss")), SelectionError, "was not computed by a recorded"),
    (lambda gm: (gm.record(), gm.run(), gm.backward("logits", np.ones(3))), FeedError, r"dy has shape \(3,\)"),
    (lambda gm: gm.run({"W1": np.zeros((8, 16))}), FeedError, "'W1' is a parameter"),
    (lambda gm: gm.run({"nope": 1.0}), FeedError, "names no tensor"),
])
def test_errors(model, action, error, message):
    gm = manager(model)
    with pytest.raises(error, match=message) as err:
        action(gm)
    assert "\n" not in str(err.value)
    gm.release()


def test_non_float_names_are_refused():
    m = int_model()
    with pytest.raises(SelectionError, match="'s' is int64: only float tensors can be attached"):
        GradManager(m).attach("s")
    gm = GradManager(m).attach(["W", "f"])
    with gm:
        gm.run({"X": np.array([3.0, 4.0], np.float32)}, outputs=["Y", "f"])
        with pytest.raises(SelectionError, match="int64: gradients need a float y"):
            gm.backward(torch.tensor([1, 2]))
    assert list(gm.params) == ["W"]


def test_run_outside_a_recording_records_nothing(model):
    gm = manager(model)
    out = gm.run(feeds(16))
    assert out["loss"].grad_fn is None
    with pytest.raises(RecordingError):
        gm.backward("loss")
    with pytest.raises(KeyError):
        with gm:
            gm.run(feeds(16))["no such output"]
    assert not gm.recording and not gm.params.recorders


# --- property: random attach subsets, accumulation counts and overlapping callback chains ------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sets(st.sampled_from(PARAMS), min_size=1), st.floats(-2, 2), st.floats(-1, 1)),
                min_size=1, max_size=4),
       st.lists(st.integers(0, 50), min_size=1, max_size=3))
def test_attach_subsets_callbacks_and_accumulation_property(attaches, seeds):
    gm = GradManager(_SHARED_MODEL, dtype="float64")
    chains: dict[str, list[tuple[float, float]]] = {}
    for names, a, b in attaches:
        gm.attach(sorted(names), callbacks=lambda n, g, a=a, b=b: a * g + b)
        for n in sorted(names):
            chains.setdefault(n, []).append((a, b))
    for s in seeds:
        with gm:
            gm.run(feeds(s))
            gm.backward("loss")
    assert set(gm.grad) == set(chains)
    per_batch = [torch_grads("loss", sorted(chains), [s]) for s in seeds]
    for n, chain in chains.items():
        want = 0
        for grads in per_batch:
            g = grads[n]
            for a, b in chain:
                g = a * g + b
            want = want + g
        close(gm.grad[n], want, tol=1e-10)
