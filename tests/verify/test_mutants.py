"""The verifier under test: wrong VJPs injected on purpose (engine/conformance/mutants.py).

A mutant that moves the float64 gradient by 1% or more must never pass in auto, full or fast mode;
in sample mode only when the sample missed every element it changed. The unmutated models must
never fail, and pass resolved. Models: the sample models and NNSmith's random graphs (seeded;
the long sweep, the real exports and gradcheck's side are in benchmarks/bench_mutants.py).
"""
import os

import numpy as np
import pytest
import torch

import engine
from engine import registry
from engine.conformance.mutants import KINDS, Mutant, candidates, injected, spoil
from engine.conformance.mutation import KILLED, SURVIVED, run_mutants
from engine.verify.context import build
from tests import nnsmith_graphs as ng
from tests.nnsmith_sweep import checked_selections, mutated_selections
from tests.verify_models import SAMPLES

SAMPLE_CASES = {  # name: (y, xs, zs, feeds, kinds)
    "spec_conv_gemm": ("Y", ["W", "Z"], ["X"], {"X": np.random.default_rng(1).standard_normal((1, 1, 4, 4), np.float32)},
                       KINDS),
    "mlp": ("loss", ["W1", "b1", "W2", "b2"], ["X", "T"], None, KINDS),
    "residual_fanout": ("loss", ["X", "W"], [], None, KINDS),
    "lstm_step": ("loss", ["X", "W", "R", "B", "initial_h", "initial_c"], [], None, KINDS),
    "small_cnn": ("logits", ["X", "conv1_W", "bn_scale", "bn_B", "fc_W"], [], None, ("scale_1.05", "permute")),
    "transformer_block": ("loss", ["X", "Wq", "Wk", "Wv", "Wo", "ln1_scale", "W1", "W2"], [], None,
                          ("scale_1.05", "zero_part")),
}


def _mul_vjp(kind, index, a, b, dy):
    true = [dy * b, dy * a]
    return spoil(kind, index, true, (dy,), (a, b), lambda x, y: x * y, {})


def test_each_kind_spoils_the_vjp_as_it_says():
    a, b = torch.arange(1.0, 7.0).reshape(2, 3), torch.full((2, 3), 2.0)
    dy = torch.ones(2, 3)
    assert torch.equal(_mul_vjp("sign", 0, a, b, dy)[0], -2 * dy)
    assert torch.allclose(_mul_vjp("scale_1.1", 1, a, b, dy)[1], 1.1 * a)
    assert torch.equal(_mul_vjp("drop_factor", 0, a, b, dy)[0], dy)  # b taken as ones
    assert torch.equal(_mul_vjp("swap", 0, a, b, dy)[0], a) and torch.equal(_mul_vjp("swap", 0, a, b, dy)[1], 2 * dy)
    zeroed = _mul_vjp("zero_part", 1, a, b, dy)[1].reshape(-1)
    assert torch.equal(zeroed[:3], a.reshape(-1)[:3]) and not zeroed[3:].any()
    assert torch.equal(_mul_vjp("permute", 1, a, b, dy)[1], a.t().contiguous().reshape(2, 3))
    # A broadcast input's gradient averaged over the broadcast axis instead of summed.
    row = torch.tensor([1.0, 2.0, 3.0])
    out = spoil("broadcast", 1, [dy * row, dy.sum(0) * 1.0], (dy,), (torch.ones(2, 3), row), lambda x, y: x * y, {})
    assert torch.equal(out[1], dy.sum(0) / 2)


def test_an_injected_mutant_is_undone_and_spoils_only_the_backward():
    before = [e.fn for e in registry.supported_ops() if e.op_type == "Tanh"]
    x = torch.linspace(-1, 1, 5, dtype=torch.float64, requires_grad=True)
    with injected(Mutant("Tanh", "scale_1.1", 0)):
        fn = next(e.fn for e in registry.supported_ops() if e.op_type == "Tanh")
        assert torch.equal(fn(x.detach()), torch.tanh(x.detach()))  # the forward is the op's own
        (g,) = torch.autograd.grad(fn(x).sum(), x)
        assert torch.allclose(g, 1.1 * (1 - torch.tanh(x.detach()) ** 2))
    assert [e.fn for e in registry.supported_ops() if e.op_type == "Tanh"] == before


def _assert_never_passed(report, modes, kill_rate=True):
    for mode in modes:
        tally = report.tally(mode)
        assert tally[SURVIVED] == 0, (mode, [o.mutant.label for o in report.survivors(mode)], report.summary())
        counted = report.counted
        if mode == "auto" and counted and kill_rate:
            assert tally[KILLED] >= 0.95 * counted, report.summary()
    assert all(v != "fail" for v in report.right.values()), report.summary()


@pytest.mark.parametrize("name", sorted(SAMPLE_CASES))
def test_no_mutant_of_a_sample_model_passes(name):
    y, xs, zs, feeds, kinds = SAMPLE_CASES[name]
    path = os.path.join(SAMPLES, f"{name}.onnx")
    probe = engine.load(path)
    mutants = [m for m in candidates(build(probe, y, xs, zs, feeds, None, 0, "cpu", False)) if m.kind in kinds]
    modes = ("auto", "fast") if kinds == KINDS else ("auto",)
    report = run_mutants(lambda: engine.load(path), y, xs, zs, feeds, modes=modes, mutants=mutants)
    assert report.counted >= 10, report.summary()  # not vacuous
    _assert_never_passed(report, modes)
    assert all(v == "pass" for v in report.right.values()), report.summary()


NNSMITH_CHUNKS = [((1, 5), ("float32", "float64"), ("auto", "fast", "sample")),
                  ((5, 8), ("float32", "float64"), ("auto", "fast")),
                  ((20, 26), ("float16", "float32", "float64"), ("auto", "fast"))]  # four float16 graphs


@pytest.mark.slow
@pytest.mark.parametrize("seeds, dtypes, modes", NNSMITH_CHUNKS, ids=[f"{a}-{b}-{d[0]}" for (a, b), d, _ in NNSMITH_CHUNKS])
def test_no_mutant_of_a_random_graph_passes(seeds, dtypes, modes):
    """NNSmith's graphs (its own op specs, exported by torch): every selection's mutants; a
    sample-mode pass is allowed only where the sample missed the change."""
    if not ng.available():
        pytest.skip("nnsmith is not installed")
    counted = killed = 0
    for *_, report in mutated_selections(range(*seeds), dtypes, modes):
        _assert_never_passed(report, ("auto", "fast"), kill_rate=False)
        assert not report.survivors("sample"), report.summary()  # a sample-mode pass only where it saw no change
        counted += report.counted
        killed += report.tally("auto")[KILLED]
    assert counted >= 50, (seeds, dtypes, counted)  # not vacuous
    assert killed >= 0.95 * counted, (killed, counted)


@pytest.mark.slow
@pytest.mark.parametrize("seeds, dtypes", [((0, 50), ("float32", "float64")), ((0, 30), ("float16", "float32", "float64"))],
                         ids=["f32-64", "f16"])
def test_random_graphs_are_never_failed_and_mostly_resolved(seeds, dtypes):
    """The unmutated graphs, by default (auto): no failure where the engine's gradient agrees with
    torch autograd in float64, and (nearly) every selection a resolved pass; the long sweep
    (benchmarks/bench_mutants.py) holds the 97%."""
    if not ng.available():
        pytest.skip("nnsmith is not installed")
    verdicts = []
    for seed, _, report, agrees in checked_selections(range(*seeds), dtypes):
        assert not (agrees and report.verdict == "fail"), (seed, report.summary())
        verdicts.append(report.verdict)
    assert len(verdicts) >= 40
    assert verdicts.count("pass") >= 0.95 * len(verdicts), {v: verdicts.count(v) for v in set(verdicts)}
