"""Integer attributes out of range are one line naming the attribute, before any allocation (issue 35).

The issue's own mutants run under an address-space cap (tests/attribute_fuzz.py's `address_space_cap`):
a check that failed would ask for tens of GiB and fail there, not exhaust the machine. Where the range is
onnxruntime's, onnxruntime is the oracle: it refuses the same mutant; where it is torch's (an axis), torch is.
"""
from __future__ import annotations

import os
import re
import time
import warnings

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import AttributeProto, helper

import engine
from engine.errors import BadAttributeError, OnnxGradError
from engine.ops import attribute_ranges
from tests import attribute_fuzz

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "sample_models")
ONE_LINE = re.compile(r"^node '[^']+' \(\w+\): attribute '(\w+)' is [^\n]+, expected [^\n]+$")


def _mutated(path: str, op_type: str, name: str, value) -> bytes:
    """The sample model with `name` of its first `op_type` node set to `value` (added when absent)."""
    m = onnx.load(path)
    node = next(n for n in m.graph.node if n.op_type == op_type)
    for a in node.attribute:
        if a.name == name:
            node.attribute.remove(a)
            break
    node.attribute.append(helper.make_attribute(name, value))
    return m.SerializeToString()


def _feeds(model) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for name in model.inputs:
        info = model.graph.types[name]
        shape = tuple(d if isinstance(d, int) and d > 0 else 2 for d in info.shape)
        out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _refusal(data: bytes, grad: bool = False) -> str:
    """The one line the engine refuses `data` with, under a 4 GiB cap; fails the test if it runs."""
    with attribute_fuzz.address_space_cap(4), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = engine.load(data)
        feeds = _feeds(model)
        with pytest.raises(BadAttributeError) as err:
            if grad:  # the samples' inputs are initializers with values: X is one
                model.gradient(model.outputs[0], ["X"], [], feeds=feeds)
            else:
                model.run(feeds)
    return str(err.value)


def _onnxruntime_refuses(data: bytes, feeds: dict) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # noqa: BLE001 - any refusal, at session creation or at run
        return True
    return False


def test_the_issues_layer_norm_axis_is_one_line_in_run_and_gradient():
    """transformer_block's LayerNormalization with axis -2³¹ grew to 23 GB; now it names the axis and the range."""
    data = _mutated(os.path.join(SAMPLES, "transformer_block.onnx"), "LayerNormalization", "axis", -2**31)
    for grad in (False, True):
        line = _refusal(data, grad)
        assert ONE_LINE.match(line) and "'axis' is -2147483648" in line and "[-3, 2]" in line, line
    model = engine.load(data)
    assert _onnxruntime_refuses(data, _feeds(model))


@pytest.mark.parametrize("op_type, name, value, where", [
    ("Conv", "pads", [0, 0, 2**31 - 1, 0], "each at most 1073741824"),
    ("Conv", "strides", [0, 1], "each in [1, 2147483647]"),
    ("Conv", "dilations", [2**31 - 1, 1], "a dilated window"),
    ("Conv", "group", 2**31, "a divisor of X's"),
    ("MaxPool", "pads", [2**31 - 1, 0, 0, 0], "below its kernel_shape entry"),
    ("MaxPool", "kernel_shape", [2**31, 2], "each in [1, 2147483647] (torch's kernels take 32-bit sizes)"),
    ("MaxPool", "kernel_shape", [2**31 - 1, 2], "a dilated window"),
    ("MaxPool", "strides", [-2**31, 1], "each in [1, 2147483647]"),
    ("AveragePool", "pads", [0, 2**31 - 1, 0, 0], "below its kernel_shape entry"),
])
def test_the_issues_conv_and_pool_mutants_name_their_attribute(op_type, name, value, where):
    """small_cnn's Conv and pool mutants asked for 256 GiB and more; each is now a line naming the attribute."""
    data = _mutated(os.path.join(SAMPLES, "small_cnn.onnx"), op_type, name, value)
    line = _refusal(data)
    assert ONE_LINE.match(line) and ONE_LINE.match(line).group(1) == name and where in line, line


@pytest.mark.parametrize("op_type, name, value", [
    ("Conv", "strides", [0, 1]), ("Conv", "group", 3), ("MaxPool", "pads", [2, 0, 0, 0]),
    ("MaxPool", "kernel_shape", [0, 2]),
])
def test_onnxruntime_refuses_the_same_small_mutants(op_type, name, value):
    """The ranges are onnxruntime's: a small out-of-range value that it could run, it refuses too."""
    data = _mutated(os.path.join(SAMPLES, "small_cnn.onnx"), op_type, name, value)
    line = _refusal(data)
    assert f"'{name}'" in line
    assert _onnxruntime_refuses(data, _feeds(engine.load(data)))


def _one_node(op_type: str, shape, out_shape=None, **attributes) -> engine.Model:
    node = helper.make_node(op_type, ["x"], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(out_shape or shape))])
    return engine.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(1, 4), axis=st.integers(-6, 6))
def test_an_axis_is_refused_exactly_where_torch_refuses_it(rank, axis):
    """Softmax's axis against torch's own dim check: in range runs (and matches torch), out of range names it."""
    x = np.random.default_rng(rank).standard_normal((2,) * rank).astype(np.float32)
    model = _one_node("Softmax", x.shape, axis=axis)
    try:
        want = torch.softmax(torch.from_numpy(x), dim=axis).numpy()
    except IndexError:
        with pytest.raises(BadAttributeError, match=rf"'axis' is {axis}, expected in \[-{rank}, {rank - 1}\]"):
            model.run({"x": x})
        return
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6, atol=1e-7)


def test_a_permutation_is_checked_before_transpose_runs():
    model = _one_node("Transpose", (2, 3, 4), perm=[0, 2, 2**31 - 1])
    with pytest.raises(BadAttributeError, match=r"'perm' is \[0, 2, 2147483647\], expected a permutation of 0..2"):
        model.run({"x": np.zeros((2, 3, 4), np.float32)})
    ok = _one_node("Transpose", (2, 3, 4), (4, 2, 3), perm=[2, 0, 1]).run({"x": np.zeros((2, 3, 4), np.float32)})["y"]
    assert ok.shape == (4, 2, 3)


def test_every_integer_attribute_of_every_registered_op_has_a_rule_or_a_reason():
    """A new op's integer attribute must be given a range (BY_NAME, BY_OP) or a reason it needs none (UNCHECKED)."""
    from engine.registry import supported_ops

    missing = set()
    for impl in supported_ops():
        if impl.domain != "":
            continue
        for version in range(impl.since, (impl.until or onnx.defs.onnx_opset_version()) + 1):
            try:
                schema = onnx.defs.get_schema(impl.op_type, version, "")
            except onnx.defs.SchemaError:
                continue
            for name, attr in schema.attributes.items():
                if attr.type in (AttributeProto.INT, AttributeProto.INTS) and name not in attribute_ranges.BY_NAME \
                        and (impl.op_type, name) not in attribute_ranges.BY_OP and name not in attribute_ranges.UNCHECKED:
                    missing.add(f"{impl.op_type}.{name}")
    assert not missing, f"integer attributes with no range and no reason: {sorted(missing)}"


def test_an_attribute_check_costs_once_per_input_signature():
    """The check runs before the first call of a shape, not on every call: a repeat run pays a set lookup."""
    model = _one_node("Softmax", ("N", 3), axis=1)
    x = np.zeros((2, 3), np.float32)
    model.run({"x": x})
    calls = []
    real = attribute_ranges.check
    attribute_ranges.check = lambda *a: calls.append(a) or real(*a)
    try:
        model.run({"x": x})
        model.run({"x": np.zeros((4, 3), np.float32)})
    finally:
        attribute_ranges.check = real
    assert len(calls) == 1


def test_the_seeded_attribute_fuzz_names_every_extreme_attribute():
    """A seeded subset of tests/attribute_fuzz.py: every integer attribute of the sample models' nodes and the
    contrib cases at ±2³¹, 2³¹ − 1, 0 and rank ± 1. Every failure is one line and an OnnxGradError; every failure
    of a mutant at ±2³¹ or 2³¹ − 1 of an attribute with a range names it (benchmarks/fuzz_attributes.py runs
    all of them, onnx's node test cases too)."""
    start = time.perf_counter()
    mutants = attribute_fuzz.all_mutants(node_cases=False)
    mutants = attribute_fuzz.seeded_subset(mutants, 200, seed=int(os.environ.get("FUZZ_SEED", 0)))
    result = attribute_fuzz.sweep(mutants, memory_gb=4)
    assert result["escape"] == [], result["escape"][:5]
    ranged = [line for line in result["unnamed"] if re.search(r" = -?214748364[78]: ", line)
              and line.split(": ")[1].split("[")[0].split(" = ")[0] not in attribute_ranges.UNCHECKED]
    assert ranged == [], ranged[:5]
    assert result["named"] > 40 and result["ran"] > 40, {k: v for k, v in result.items() if isinstance(v, int)}
    assert time.perf_counter() - start < 30


def test_a_check_names_the_node_and_raises_the_error_callers_catch():
    model = _one_node("Flatten", (2, 3), (6,), axis=3)
    with pytest.raises(OnnxGradError) as err:
        model.run({"x": np.zeros((2, 3), np.float32)})
    assert isinstance(err.value, BadAttributeError)
    assert str(err.value).startswith("node ") and "'axis' is 3, expected in [-2, 2]" in str(err.value)


def test_a_gathernd_batch_dims_that_crashes_onnxs_shape_inference_is_named_instead():
    """onnx 1.23's shape inference segfaults on GatherND batch_dims = -2³¹ (the attribute fuzz found it); load
    skips inference for such a node and the run names the attribute. In a child: a regression kills it, not us."""
    import subprocess
    import sys

    script = (
        "import numpy as np, onnx, engine\n"
        "from onnx import helper, TensorProto as T\n"
        "node = helper.make_node('GatherND', ['d', 'i'], ['y'], batch_dims=-2**31)\n"
        "g = helper.make_graph([node], 'g', [helper.make_tensor_value_info('d', T.FLOAT, [2, 2]),\n"
        "    helper.make_tensor_value_info('i', T.INT64, [2, 1])], [helper.make_tensor_value_info('y', T.FLOAT, [2])])\n"
        "m = engine.load(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]))\n"
        "try:\n"
        "    m.run({'d': np.zeros((2, 2), np.float32), 'i': np.zeros((2, 1), np.int64)})\n"
        "except engine.OnnxGradError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("BadAttributeError node ") and "'batch_dims' is -2147483648" in done.stdout, done.stdout


def test_conv_pads_beyond_the_input_are_valid_as_torch_and_onnxruntime_take_them():
    """NNSmith's torch modules write them (outputs that see only zeros): no refusal, torch's values."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((2, 1, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[9, 9, 9, 9])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 20, 20])],
                              [numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).standard_normal((1, 1, 4, 4)).astype(np.float32)
    got = engine.load(proto).run({"x": x})["y"]
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=9).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    import onnxruntime as ort

    (ort_y,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, ort_y, rtol=1e-5, atol=1e-5)
