"""The fx-compiled plan against the interpreter it replaces: outputs and gradients, bit for bit,
on the sample models, onnx's light models and onnx's node test cases."""
import glob
import os
import warnings

import numpy as np
import onnx
import pytest
import torch

import engine
from engine.conformance.cases import case_info, node_cases
from engine.conformance.gradients import selection_for
from engine.conformance.runner import RANDOM_OPS, normalize
from engine.gradient.feeds import random_value
from tests import paths

ROOT = str(paths.ROOT)
SAMPLES = sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.onnx")))
LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))
CPU = torch.device("cpu")


def same(a, b) -> bool:
    """Equal values, NaNs in the same places; sequences and strings element by element."""
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                  and torch.equal(a.nan_to_num(), b.nan_to_num())))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a is b or a == b


def assert_fx_matches_interpreter(plan, values, all_values: bool = True) -> None:
    """The interpreter's results, then the fx module's (forced to be used), identical; also every
    intermediate (run_all) unless `all_values` is off (big models: the sample and node models cover it)."""
    reference = plan.interpret(values)
    plan.run(values)
    got = plan.run(values)
    assert "targets" in plan._fx, "the compiled module was not used"
    for name, a, b in zip(plan.targets, reference, got):
        assert same(a, b), f"{name}: fx differs from the interpreter"
    if not all_values:
        return
    everything = plan.interpret_all(values)
    compiled_all = plan.run_all(values)
    assert "all" in plan._fx and everything.keys() == compiled_all.keys()
    for name, v in everything.items():
        assert same(v, compiled_all[name]), f"{name} (run_all): fx differs from the interpreter"


def assert_gradients_identical(model, y, xs, zs, values) -> None:
    prepared = model.prepare_gradient(y, xs, zs)
    prepared.plan.mode = "interpret"
    ref = prepared(*values)
    prepared.plan.mode = "fx"
    prepared(*values)
    got = prepared(*values)
    assert "targets" in prepared.plan._fx
    assert same(ref.y, got.y) and ref.disconnected == got.disconnected
    for x, a, b in zip(xs, ref.grads, got.grads):
        assert same(a, b), f"d{y}/d{x}: fx differs from the interpreter"


@pytest.mark.parametrize("path", SAMPLES, ids=os.path.basename)
def test_sample_models(path):
    model = engine.load(path)
    feeds = {n: random_value(model.graph, n, 0) for n in model.inputs}
    plan = model.prepare(list(feeds), model.outputs)
    assert_fx_matches_interpreter(plan, [model.to_tensor(n, feeds[n], CPU, None) for n in plan.sources])
    floats = [n for n in list(feeds) + list(model.graph.initializers)
              if np.asarray(feeds.get(n, model.constants().get(n))).dtype.kind == "f"]
    for y in model.outputs:
        try:
            spec = model.selection(y, floats)
        except engine.SelectionError:
            continue
        values = [model.to_tensor(n, v, CPU, None) for n, v in model.selection_values(spec, feeds).items()]
        assert_gradients_identical(model, spec.y, spec.xs, spec.zs, values)


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: os.path.basename(p)[6:-5])
def test_light_models(path):
    model = engine.load(path)
    (name,) = model.inputs
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    assert_fx_matches_interpreter(model.prepare([name], model.outputs), [x], all_values=False)
    weights = [n.output[0] for n in model.graph.nodes if n.op_type == "ConstantOfShape"][-2:]
    with torch.no_grad():
        made = model.run({name: x.numpy()}, outputs=weights)
    values = [x] + [torch.from_numpy(made[w]).normal_(generator=torch.Generator().manual_seed(1)) for w in weights]
    assert_gradients_identical(model, model.outputs[0], [name, *weights], (), values)


def _node_case_chunks(k: int = 8):
    cases = [c for c in node_cases() if not RANDOM_OPS & set(case_info(c).graph_ops)]
    return [cases[i::k] for i in range(k)]


@pytest.mark.parametrize("chunk", range(8))
def test_node_cases(chunk):
    """Every node case the interpreter runs: outputs identical; gradients where the sweep has a selection."""
    compared = grads = 0
    for case in _node_case_chunks()[chunk]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = engine.load(case.model, check=False)
            except engine.OnnxGradError:
                continue
            names = [i.name for i in case.model.graph.input]
            inputs = normalize(list(case.data_sets[0][0]))[: len(names)]
            try:
                plan = model.prepare(names[: len(inputs)], model.outputs)
                values = [model.to_tensor(n, v, CPU, None) for n, v in zip(names, inputs)]
                plan.interpret(values)
            except (engine.OnnxGradError, TypeError, ValueError):
                continue  # unsupported here: nothing to compare
            assert_fx_matches_interpreter(plan, values)
            compared += 1
            selection = selection_for(case)
            if isinstance(selection, str):
                continue
            xs, zs, ys, feeds, _ = selection
            for y in ys:
                try:
                    vals = [model.to_tensor(n, feeds[n], CPU, None) for n in xs + zs]
                    model.prepare_gradient(y, xs, zs).plan.interpret(vals)
                except (engine.OnnxGradError, TypeError, ValueError):
                    continue
                assert_gradients_identical(model, y, xs, zs, vals)
                grads += 1
    assert compared > 100 and grads > 40, (compared, grads)


def test_a_registered_function_named_like_torchs_is_not_swapped_for_torchs():
    """fx emits functions whose module is torch by qualified name: a custom op built with
    functools.wraps(torch.tanh) must still be the one called (its VJP here doubles the gradient)."""
    from engine.verify import register_op_with_vjp
    from tests.verify_models import deep_chain

    with register_op_with_vjp("Tanh", torch.tanh, lambda g, i, o: (2 * g[0] * (1 - o[0] ** 2),), since=6):
        model = engine.load(deep_chain(depth=2, width=4, batch=3))
    x = torch.randn(3, 4, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    assert_gradients_identical(model, "y", ["x"], (), [x])


def test_folded_shapes_are_guarded_when_the_batch_changes():
    """Shape(x) is folded into a constant under a guard on x's shape: a new batch size must give the
    interpreter's answer again, not the first call's shape."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("ReduceSum", ["flat", "one"], ["y"], keepdims=0)]
    ints = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("zero", 0), ("one", 1), ("minus_one", -1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])], initializer=ints)
    model = engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    plan = model.prepare(["x"], ["y"])
    for n in (2, 2, 2, 5, 5, 1):
        x = torch.randn(n, 2, 3, generator=torch.Generator().manual_seed(n))
        (got,) = plan.run([x])
        assert got.shape == (n,) and same(got, plan.interpret([x])[0])
    assert "targets" in plan._fx
    assert_gradients_identical(model, "y", ["x"], (), [torch.randn(4, 2, 3)])
