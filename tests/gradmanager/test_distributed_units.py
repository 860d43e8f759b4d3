"""engine.distributed inside one process: bucket plans, the world of one, refusals, messages.

The two-process behaviour (training, faults) is in tests/gradmanager/test_distributed.py.
"""
from __future__ import annotations

import math
import pathlib

import numpy as np
import onnx
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import DistributedError, GradManager, OnnxGradError, SelectionError, distributed
from engine.distributed import agreement, allreduce, group

MLP = "sample_models/mlp.onnx"
PARAMS = ["W1", "b1", "W2", "b2"]
rng = np.random.default_rng(0)
FEEDS = {"X": rng.standard_normal((4, 8)), "T": np.eye(3)[[0, 1, 2, 0]]}


def grads(gm: GradManager, y="loss") -> dict[str, torch.Tensor]:
    with gm:
        gm.run(FEEDS)
        gm.backward(y)
    return {n: gm.grad[n].clone() for n in gm.grad}


# --- bucket plans -----------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.float64, torch.float16]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from(DTYPES)), min_size=1, max_size=12),
       st.integers(1, 2000))
def test_bucket_plans_cover_each_tensor_once_in_reverse_order_one_dtype_per_bucket(specs, cap):
    tensors = {f"t{i}": torch.zeros(n, dtype=dt) for i, (n, dt) in enumerate(specs)}
    plans = distributed.plan_buckets(tensors, cap)
    assert sorted(n for p in plans for n in p.names) == sorted(tensors)
    position = {n: i for i, n in enumerate(tensors)}
    firsts = [max(position[n] for n in p.names) for p in plans]
    assert firsts == sorted(firsts, reverse=True)  # buckets go out from the last-attached tensors
    for p in plans:
        assert {tensors[n].dtype for n in p.names} == {p.dtype}
        assert [position[n] for n in p.names] == sorted((position[n] for n in p.names), reverse=True)
        assert p.offsets == tuple(sum(tensors[n].numel() for n in p.names[:i]) for i in range(len(p.names)))
        assert p.numel == sum(tensors[n].numel() for n in p.names)
        # Only the last bucket of a dtype may be under the cap; none is over it by more than its last tensor.
        assert p.nbytes - tensors[p.names[-1]].numel() * p.dtype.itemsize < cap
    for dt in {p.dtype for p in plans}:
        assert sum(p.nbytes < cap for p in plans if p.dtype == dt) <= 1


def test_buckets_close_at_1_mb_then_25_mb_as_ddp_does():
    tensors = {f"w{i}": torch.zeros(n) for i, n in enumerate([4 * 2 ** 20, 3 * 2 ** 20, 2 ** 20, 2 ** 17, 2 ** 17])}
    cb = distributed.make_allreduce_cb("MEAN")
    plans = distributed.plan_buckets(tensors, int(cb.bucket_mb * 2 ** 20), allreduce.FIRST_BUCKET_BYTES)
    assert [p.names for p in plans] == [("w4", "w3"), ("w2", "w1", "w0")]
    assert [p.nbytes for p in plans] == [2 ** 20, 32 * 2 ** 20]
    assert allreduce.FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES  # DDP's, in this torch


# --- a world of one: no process group ---------------------------------------------------------------
def test_without_a_process_group_the_allreduce_passes_gradients_through_in_chain_order():
    assert not dist.is_initialized() and distributed.world_size() == 1 and distributed.rank() == 0
    seen = []

    def before(name, g):
        seen.append(("before", name))
        return 2 * g

    def after(name, g):
        seen.append(("after", name))
        return g + 1

    plain = grads(GradManager(MLP, dtype="float64").attach(PARAMS))
    gm = GradManager(MLP, dtype="float64").attach(PARAMS, [before, distributed.make_allreduce_cb("SUM"), after])
    assert distributed.init("cpu") == torch.device("cpu") and not dist.is_initialized()  # no WORLD_SIZE: no group
    distributed.broadcast_params(gm)  # nothing to do
    got = grads(gm)
    for n in PARAMS:
        torch.testing.assert_close(got[n], 2 * plain[n] + 1, rtol=1e-15, atol=0)
    # Each name's "before" runs as autograd produces its gradient, every "after" once the backward is over.
    assert sorted(seen[:4]) == sorted(("before", n) for n in PARAMS)
    assert [s for s, _ in seen[4:]] == ["after"] * 4


def test_save_writes_on_rank_zero_only_unless_asked(tmp_path, monkeypatch):
    gm = GradManager(MLP)
    assert gm.save(tmp_path / "zero.onnx") is True and (tmp_path / "zero.onnx").exists()
    monkeypatch.setattr(group, "rank", lambda group=None: 1)
    assert gm.save(tmp_path / "one.onnx") is False and not (tmp_path / "one.onnx").exists()
    assert gm.save(tmp_path / "one.onnx", all_ranks=True) is True
    assert (tmp_path / "one.onnx").read_bytes() == (tmp_path / "zero.onnx").read_bytes()


# --- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("action, error, message", [
    (lambda gm, cb: gm.attach("X", cb), SelectionError,
     "'X' is not a parameter: a AllreduceCallback reduces parameters' gradients, whose shapes are the same on "
     "every process"),
    (lambda gm, cb: gm.attach("W1", [cb, distributed.make_allreduce_cb()]), OnnxGradError,
     "'W1' would go through 2 streaming callbacks (all-reduces); attach it with one"),
    (lambda gm, cb: cb("W1", torch.zeros(8, 16)), OnnxGradError,
     "make_allreduce_cb('MEAN') runs inside GradManager.backward(): attach it, do not call it"),
    (lambda gm, cb: distributed.make_allreduce_cb("AVG"), OnnxGradError, "all-reduce op 'AVG' is not one of MEAN, SUM"),
    (lambda gm, cb: distributed.make_allreduce_cb(bucket_mb=0), OnnxGradError, "bucket_mb must be positive, not 0"),
])
def test_misuse_is_one_line(action, error, message):
    gm = GradManager(MLP)
    with pytest.raises(error) as failure:
        action(gm, distributed.make_allreduce_cb("MEAN"))
    assert str(failure.value) == message


def test_a_second_allreduce_attached_later_to_the_same_name_is_refused_and_changes_nothing():
    gm = GradManager(MLP).attach("W1", distributed.make_allreduce_cb())
    with pytest.raises(OnnxGradError, match="2 streaming callbacks"):
        gm.attach(["b1", "W1"], distributed.make_allreduce_cb())
    assert list(gm.attached) == ["W1"] and len(gm.attached["W1"]) == 1


# --- what differs between ranks, in words -----------------------------------------------------------
def test_differences_are_named_model_first_and_the_doc_quotes_them():
    mlp = GradManager(MLP)
    proto = onnx.load(MLP)
    proto.graph.node[1].op_type = "Sigmoid"
    sigmoid = GradManager(engine.load(proto))
    base = agreement.describe(mlp, PARAMS, "MEAN")
    say = agreement.difference
    quoted = [say(base, agreement.describe(sigmoid, PARAMS[:3], "SUM"), 1),
              say(base, agreement.describe(mlp, PARAMS[:3], "MEAN"), 1)]
    assert quoted == ["the model differs: node 1 is Relu(H1) -> A1 on rank 0 but Sigmoid(H1) -> A1 on rank 1",
                      "the attach set differs: 'b2' goes through the all-reduce on rank 0 but not on rank 1"]
    assert say(agreement.describe(mlp, PARAMS[:3], "MEAN"), base, 3) == \
        "the attach set differs: 'b2' goes through the all-reduce on rank 3 but not on rank 0"
    assert say(base, agreement.describe(mlp, PARAMS, "SUM"), 1) == "the all-reduce is MEAN on rank 0 but SUM on rank 1"
    wider = GradManager(MLP, dtype="float64")
    assert say(base, agreement.describe(wider, PARAMS, "MEAN"), 1) == \
        "the model differs: parameter 'W1' is (8, 16) float32 on rank 0 but (8, 16) float64 on rank 1"
    with torch.no_grad():
        mlp.params["b2"].add_(1)
    quoted.append(say(base, agreement.describe(mlp, PARAMS, "MEAN"), 1))
    assert quoted[-1] == ("parameter 'b2' has other values on rank 1 than on rank 0: call "
                          "engine.distributed.broadcast_params(gm) once after building the manager")
    doc = " ".join(pathlib.Path("docs/gradmanager.md").read_text().split())
    assert [q for q in quoted if q not in doc] == []


def test_a_gradient_produced_on_some_ranks_only_is_an_error_on_every_rank():
    plan = distributed.plan_buckets({"W2": torch.zeros(16, 3), "b2": torch.zeros(3)}, 10 ** 6)[0]
    bucket = allreduce._Bucket(plan)
    bucket.flat[plan.numel:] = torch.tensor([2.0, 1.0])  # counts after the all-reduce: b2 on 2 ranks, W2 on 1
    with pytest.raises(DistributedError) as failure:
        distributed.make_allreduce_cb()._check_counts(bucket, 2)
    assert str(failure.value) == ("rank 0 of 1: 'W2' got a gradient on 1 of 2 ranks in this backward: "
                                  "every rank must differentiate the same y")


@pytest.mark.parametrize("raw, reason", [
    ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[127.0.0.1]:6071. This is typically caused by a remote worker crashing. Check the logs",
     "Connection closed by peer [127.0.0.1]:6071"),
    ("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete",
     "Timed out waiting 5000ms for recv operation to complete"),
    ("Operation timed out!", "Operation timed out"),
    ("Timed out after 4 seconds waiting for clients. 1/2 clients joined.",
     "Timed out after 4 seconds waiting for clients. 1/2 clients joined"),
    ("", "RuntimeError"),
])
def test_backend_failures_are_cut_to_their_first_sentence(raw, reason):
    assert group.backend_reason(RuntimeError(raw)) == reason


# --- a real gloo group of one process -----------------------------------------------------------------
@pytest.fixture
def world_of_one(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_each_bucket_is_sent_as_soon_as_the_backward_has_filled_it(world_of_one, monkeypatch):
    events = []
    send = dist.all_reduce

    def spy(tensor, *args, **kw):
        events.append(("send", tensor.numel()))
        return send(tensor, *args, **kw)

    monkeypatch.setattr(dist, "all_reduce", spy)

    def produced(name, g):
        events.append(("grad", name))
        return g

    cb = distributed.make_allreduce_cb("MEAN", bucket_mb=100 / 2 ** 20)
    gm = GradManager(MLP, dtype="float64").attach(PARAMS, [produced, cb])
    plain = grads(GradManager(MLP, dtype="float64").attach(PARAMS))
    got = grads(gm)
    # Buckets [b2, W2], [b1], [W1]: each goes out right after its last gradient, before the next arrives.
    assert events == [("grad", "b2"), ("grad", "W2"), ("send", 3 + 48 + 2), ("grad", "b1"), ("send", 17),
                      ("grad", "W1"), ("send", 129)]
    assert cb.last_backward.buckets == 3 and cb.last_backward.sent_during_backward == 3
    assert cb.last_backward.nbytes == 8 * (3 + 48 + 16 + 128)
    for n in PARAMS:
        torch.testing.assert_close(got[n], plain[n], rtol=0, atol=0)  # a mean over one rank
    # A backward that reaches only W1 and b1 still sends every bucket (the ranks' collectives pair up).
    events.clear()
    gm.zero_grad()
    got = grads(gm, y="H1")
    assert sorted(got) == ["W1", "b1"] and [e for e in events if e[0] == "send"] == [("send", 53), ("send", 17),
                                                                                      ("send", 129)]
    assert cb.last_backward.sent_during_backward == 0  # the first bucket never filled during the backward
    assert math.isclose(distributed.world_size(), 1)


def test_a_second_order_gradient_cannot_cross_the_allreduce(world_of_one):
    model = engine.load(MLP)
    outer = GradManager(model, dtype="float64").attach("W2")
    inner = GradManager(model, params=outer.params).attach("W2", distributed.make_allreduce_cb())
    with outer:
        with inner:
            inner.run(FEEDS)
            with pytest.raises(OnnxGradError) as failure:
                inner.backward("loss")
    assert str(failure.value) == ("the all-reduce cannot carry 'W2''s second-order graph to the other ranks; "
                                  "take higher-order gradients without it")


def test_buckets_are_filled_again_only_once_no_gradient_holds_them(world_of_one):
    cb = distributed.make_allreduce_cb("MEAN", bucket_mb=100 / 2 ** 20)
    gm = GradManager(MLP, dtype="float64").attach(PARAMS, cb)
    plain = grads(GradManager(MLP, dtype="float64").attach(PARAMS))

    def backward_reusing() -> list[bool]:
        before = {id(b): b.flat.data_ptr() for b in cb._spare}
        got = grads(gm)
        for n in PARAMS:
            torch.testing.assert_close(got[n], plain[n] * (1 + (n in accumulated)), rtol=1e-15, atol=0)
        return [before.get(id(b)) == b.flat.data_ptr() for b in cb._spare]

    accumulated = ()
    assert backward_reusing() == [False] * 3
    accumulated = PARAMS  # gm.grad still holds views of the first buffers: new ones, and the sums are right
    assert backward_reusing() == [False] * 3
    accumulated = ()
    gm.zero_grad()
    assert backward_reusing() == [True] * 3  # nothing held them: filled again
    kept = gm.grad["W1"].view(-1)  # a view of a view still holds [W1]'s buffer
    gm.zero_grad()
    assert backward_reusing() == [True, True, False]
    torch.testing.assert_close(kept, plain["W1"].view(-1), rtol=1e-15, atol=0)


def test_init_refuses_a_second_group_and_a_rendezvous_without_rank(world_of_one, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(OnnxGradError) as failure:
        distributed.init("cpu")
    assert str(failure.value) == ("a torch.distributed process group already exists: call engine.distributed.init() "
                                  "once per process")
    dist.destroy_process_group()
    monkeypatch.delenv("RANK", raising=False)
    try:
        with pytest.raises(OnnxGradError) as failure:
            distributed.init("cpu", init_method=f"file://{tmp_path}/store")
        assert str(failure.value) == (f"init_method 'file://{tmp_path}/store' needs RANK and WORLD_SIZE in the "
                                      "environment")
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # for the fixture to end
