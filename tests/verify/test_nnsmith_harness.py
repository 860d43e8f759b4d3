"""NNSmith's random graphs (tests/nnsmith_graphs.py): the harness itself, and onnxgrad's forward and
gradients against NNSmith's own torch module on a seeded sweep.

The sweep is small (30 seeds, ~10 s) so it runs with the suite; a longer one is the same loop
over more seeds. A disagreement found that way becomes a seed here.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("nnsmith")

import engine  # noqa: E402
from tests import nnsmith_graphs as ng  # noqa: E402

SWEEP = range(30)  # float32/float64 graphs (nnsmith may mix in a float16 comparison); all 30 generate
SIGMOID_SEED, SIGMOID_Y = 12, "v9_0"  # a float64 graph: Cos, Resize, Sigmoid, Resize, Concat, ReduceMax ... -> v9_0


@pytest.fixture(scope="module")
def graphs() -> dict[int, ng.RandomGraph]:
    made = {seed: ng.generate(seed) for seed in SWEEP}
    assert sum(g is not None for g in made.values()) >= 25, "nnsmith generated fewer than 25 of the graphs"
    return {seed: g for seed, g in made.items() if g is not None}


def flip_sign(true_vjps, grads, inputs, outputs):
    return tuple(None if v is None else -v for v in true_vjps)


def test_a_seed_gives_the_same_graph_whatever_came_before():
    first = ng.generate(29)
    ng.generate(5)  # leaves z3's context, and nnsmith's seeded global states, as they were
    again = ng.generate(29)
    assert first.onnx == again.onnx and first.ops == again.ops
    assert first.feeds.keys() == again.feeds.keys() and all(np.array_equal(first.feeds[k], again.feeds[k]) for k in first.feeds)
    assert ng.generate(28).onnx != first.onnx


def test_generating_leaves_the_global_random_states_alone():
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    ng.generate(3)
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state))


def test_names_map_onto_the_module(graphs):
    for g in graphs.values():
        proto = g.proto.graph
        assert [i.name for i in proto.input] == list(g.module.input_like) == list(g.feeds)
        assert [o.name for o in proto.output] == list(g.module.output_like) == list(g.outputs) == list(g.expected)
        assert {t.name for t in proto.initializer} <= set(g.module.state_dict())


def test_selections(graphs):
    weights = 0
    for g in graphs.values():
        params = dict(g.module.named_parameters())
        for y, xs, zs in ng.selections(g):
            assert y in g.outputs and xs and not set(xs) & set(zs)
            assert all(x in g.feeds and g.feeds[x].dtype.kind == "f" or x in params for x in xs)
            assert set(zs) | {x for x in xs if x in g.feeds} == set(g.feeds)
            weights += sum(x in params for x in xs)
    assert weights > 10  # nnsmith's constants and layer weights are initializers, and differentiated


def test_onnx_op_type_table_matches_the_exports(graphs):
    """Each instruction ONNX_OP_TYPE maps is a node of that type, unless the exporter merged or dropped
    some (equal ops on one input, nested Concats, no-op Squeezes): then a mutation is refused."""
    checked = refused = 0
    for g in graphs.values():
        mapped = [ng._onnx_type(inst[3]) for inst in g.module.instructions]
        for op_type in {m for m in mapped if m}:
            checked += 1
            if g.onnx_op_types.count(op_type) < mapped.count(op_type):
                refused += 1
                with pytest.raises(ValueError, match="merged or dropped"), ng.mutate_torch_module(g, op_type, flip_sign):
                    pass
    assert checked > 150 and refused <= 3


def test_forward_matches_torch_and_nnsmiths_oracle(graphs):
    for g in graphs.values():
        model = engine.load(g.onnx)
        promoted, native = model.run(dict(g.feeds), dtype="float64"), model.run(dict(g.feeds))
        for y in g.outputs:
            want = ng.torch_function(g, y, [])().detach().numpy()
            # ONNX attributes are float32 (LeakyRelu's alpha) and GELU's constants have the
            # model's type: 2e-8 off, up to 3e-7 through a Tan near its pole
            assert ng.relative_l2(promoted[y], want) <= 1e-5, (g.seed, y)
            # torch's and the engine's kernels round differently (float32: 6e-5 seen, ill-conditioned);
            # nnsmith's dtype choices bind its inputs, not every op: a float16 Greater shows up in seed 23
            tol = {"float16": 1e-2, "float32": 1e-3, "float64": 1e-6}[g.dtype]
            assert ng.relative_l2(native[y].astype(np.float64), g.expected[y].astype(np.float64)) <= tol, (g.seed, y)


def test_gradients_match_torch_autograd(graphs):
    judged, nonvacuous, failures = 0, 0, {}
    for g in graphs.values():
        c = ng.engine_gradient_matches_torch(g, tol=1e-6)
        if c.nonfinite:  # torch's own gradient is NaN/Inf: nothing to compare with
            continue
        failures.update({(g.seed, *k): (e, g.ops) for k, e in c.failures.items()})
        judged += len(c.errors) - len(c.kinked)
        nonvacuous += len(c.errors) - len(c.kinked) - len(c.zero)
    assert not failures
    assert judged > 150 and nonvacuous > 60  # most (y, x) are compared, and not only where both are zero


def test_a_sign_flipped_vjp_changes_torch_and_is_caught(graphs):
    g = graphs[SIGMOID_SEED]
    y, xs, _ = next(s for s in ng.selections(g) if s[0] == SIGMOID_Y)
    dy = ng.random_dy(g, y)
    before = ng.torch_gradient(g, y, xs, dy)
    values = [v.requires_grad_() for v in ng.torch_values(g, xs)]
    seed = torch.from_numpy(dy)

    def gradcheck():  # of <dy, y>: one backward per check, where y's 665 elements would take 665
        f = ng.torch_function(g, y, xs)
        return torch.autograd.gradcheck(lambda *v: (f(*v) * seed).sum(), values, raise_exception=False)

    assert gradcheck()
    assert ng.engine_gradient_matches_torch(g).failures == {}

    with ng.mutate_torch_module(g, "Sigmoid", flip_sign) as swapped:
        assert swapped == 1
        after = ng.torch_gradient(g, y, xs, dy)
        assert not gradcheck()
        caught = ng.engine_gradient_matches_torch(g).failures
    changed = [x for x in xs if not np.allclose(after[x], before[x])]
    assert changed and {(y, x) for x in changed} <= set(caught)
    assert all(np.array_equal(ng.torch_gradient(g, y, xs, dy)[x], before[x]) for x in xs)  # swapped back


def test_a_mutated_conv_sees_its_weights_in_onnx_order(graphs):
    g = graphs[0]  # its Conv1d's weight and bias are initializers
    seen = []

    def record(true_vjps, grads, inputs, outputs):
        seen.append([tuple(t.shape) for t in inputs])
        return true_vjps

    y, xs, _ = next(s for s in ng.selections(g) if any(x.endswith(".weight") for x in s[1]))
    with ng.mutate_torch_module(g, "Conv", record) as swapped:
        assert swapped == 1
        ng.torch_gradient(g, y, xs, ng.random_dy(g, y))
    conv = next(m for m in g.module.mlist if isinstance(m, torch.nn.Conv1d))
    assert seen and seen[0][1:] == [tuple(conv.weight.shape), tuple(conv.bias.shape)]  # X, W, B


def test_float16_graphs_run_in_float16():
    g = ng.generate(3, dtypes=("float16",))
    assert g.dtype == "float16" and all(v.dtype == np.float16 for v in g.feeds.values())
    native = engine.load(g.onnx).run(dict(g.feeds))
    for y in g.outputs:
        assert native[y].dtype == g.expected[y].dtype
        assert ng.relative_l2(native[y].astype(np.float64), g.expected[y].astype(np.float64)) <= 1e-2, y
    # GELU's constants are float16 in the model (1.4140625 for √2): 1e-4 off torch's; none here
    assert "GELU" not in g.ops and ng.engine_gradient_matches_torch(g, tol=1e-6).failures == {}
