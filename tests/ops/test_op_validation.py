"""Each contrib op checks its inputs before its forward runs (`@validates`, engine/ops/inputs.py): one
input's dim broken in a conformance case gives one line naming the node, the input, the expected and
the actual dims, never a raw torch message or silent numbers; onnxruntime refuses the same model (so
the check mirrors the kernel's and is no stricter); every unbroken case passes its validator."""
from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest

import engine
from engine.cli import main as cli_main
from engine.conformance.contrib import case_model, expected, onnxruntime_outputs
from engine.conformance.contrib_cases import all_cases
from engine.errors import InputShapeError
from engine.registry import record

ort = pytest.importorskip("onnxruntime")

GQA = "GroupQueryAttention/decode-b2s1-h4/2x16-do_rotary-rotary_interleaved1-softcap1.5-out3"
ROTARY = "RotaryEmbedding/3d-2x3-h2x8-pos2x3-num_heads2"
# (op, the case: an input it gives or its name, {input: broken shape}, the error's tail: "dim A is X, expected Y"...)
BROKEN = [
    ("GroupQueryAttention", GQA, {"past_key": (2, 2, 5, 1)}, "dim 3 is 1, expected 16"),
    ("GroupQueryAttention", GQA, {"past_value": (2, 1, 5, 16)}, "dim 1 is 1, expected 2"),
    ("GroupQueryAttention", GQA, {"key": (2, 1, 24)}, "dim 2 is 24, expected 32"),
    ("GroupQueryAttention", GQA, {"seqlens_k": (3,)}, "dim 0 is 3, expected 2"),
    ("GroupQueryAttention", GQA, {"total_sequence_length": (2,)}, "expected a scalar"),
    ("GroupQueryAttention", GQA, {"cos_cache": (16, 12), "sin_cache": (16, 12)}, "dim 1 is 12, expected at most 8"),
    ("GroupQueryAttention", "head_sink", {"head_sink": (3,)}, "expected shape [2]"),
    ("MultiHeadAttention", "past_key", {"past_key": (1, 2, 2, 5)}, "dim 3 is 5, expected 3"),
    ("MultiHeadAttention", "bias", {"bias": (20,)}, "expected shape [18]"),
    ("MultiHeadAttention", "MultiHeadAttention/cross-2x3x8-kv5-bias-out1", {"key": (2, 5, 6)}, "dim 2 is 6, expected 8"),
    ("Attention", "bias", {"weights": (5, 18)}, "dim 0 is 5, expected 6"),
    ("Attention", "bias", {"bias": (17,)}, "expected shape [18]"),
    ("Attention", "past", {"past": (2, 2, 2, 2, 3)}, "dim 4 is 3, expected 4"),
    ("RotaryEmbedding", ROTARY, {"cos_cache": (10, 3), "sin_cache": (10, 3)}, "dim 1 is 3, expected 4"),
    ("RotaryEmbedding", ROTARY, {"position_ids": (2, 2)}, "expected [1] or [2, 3]"),
    ("SkipLayerNormalization", "beta", {"gamma": (7,)}, "expected shape [8]"),
    ("SkipLayerNormalization", "beta", {"skip": (2, 3, 6)}, "dim 2 is 6, expected 8"),
    ("SkipSimplifiedLayerNormalization", "gamma", {"gamma": (9,)}, "expected shape [8]"),
    ("LayerNormalization", "B", {"Scale": (7,)}, "does not broadcast to [8]"),
    ("SimplifiedLayerNormalization", "scale", {"scale": (5,)}, "does not broadcast to [8]"),
    ("EmbedLayerNormalization", "gamma", {"gamma": (6,)}, "expected shape [8]"),
    ("EmbedLayerNormalization", "segment_ids", {"position_embedding": (8, 7)}, "dim 1 is 7, expected 8"),
    ("MatMulNBits", "scales", {"A": (3, 31)}, "dim 1 is 31, expected 32"),
    ("MatMulNBits", "scales", {"scales": (9,)}, "holds 9 values, expected 10"),
    ("GatherBlockQuantized", "scales", {"scales": (5, 3)}, "dim 1 is 3, expected 2"),
    ("DynamicQuantizeMatMul", "bias", {"B": (7, 5)}, "dim 0 is 7, expected 8"),
    ("DynamicQuantizeMatMul", "bias", {"bias": (4,)}, "expected shape [5]"),
    ("MatMulIntegerToFloat", "bias", {"b_scale": (4,)}, "expected a scalar or [5]"),
    ("BiasGelu", "B", {"B": (6,)}, "expected shape [7]"),
    ("FastGelu", "bias", {"bias": (3,)}, "expected shape [7]"),
    ("BiasAdd", "bias", {"bias": (7,)}, "expected shape [8]"),
    ("BiasSplitGelu", "bias", {"bias": (6,)}, "expected shape [8]"),
    ("GemmFastGelu", "W", {"W": (3, 5)}, "dim 0 is 3, expected 4"),
    ("FusedMatMul", "B", {"B": (3, 5)}, "its K dim is 3, expected 4"),
    ("FusedConv", "W", {"W": (4, 3, 3, 3)}, "dim 1 is 3, expected 4"),
]
# No CPU kernel in onnxruntime (CUDA or ROCm only): the conformance sweep's oracle, the op written in
# standard ops, is what refuses the broken model instead.
NO_CPU_KERNEL = {"BiasAdd", "BiasSplitGelu", "GemmFastGelu"}
# Elementwise on any shape: nothing to check.
UNCHECKED = {"Gelu", "QuickGelu"}


def _case(op: str, given: str):
    return next(c for c in all_cases() if c.op == op and (c.name == given or dict(c.inputs).get(given) is not None))


def _broken(case, shapes: dict):
    rng = np.random.default_rng(0)
    inputs = []
    for name, value in case.inputs:
        if name in shapes:
            dtype = value.dtype if value is not None else np.float32
            value = (rng.standard_normal(shapes[name]) if dtype.kind == "f" else np.zeros(shapes[name])).astype(dtype)
        inputs.append((name, value))
    return dataclasses.replace(case, inputs=tuple(inputs))


def _model(case, whole):
    """The broken case's model, its outputs typed (not sized) from the unbroken case's onnxruntime outputs."""
    model = case_model(case, out_values=expected(whole, "float32"))
    for out in model.graph.output:
        for i, dim in enumerate(out.type.tensor_type.shape.dim):
            dim.dim_param = f"{out.name}_{i}"
    return model


@pytest.mark.parametrize("op, given, shapes, tail", BROKEN, ids=[f"{b[0]}-{'-'.join(b[2])}" for b in BROKEN])
def test_a_broken_input_is_one_line_naming_node_input_and_dims_and_onnxruntime_refuses_it_too(op, given, shapes, tail):
    whole = _case(op, given)
    case = _broken(whole, shapes)
    model = _model(case, whole)
    with pytest.raises(InputShapeError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.load(model).run(case.feeds())
    msg = str(err.value)
    assert "\n" not in msg
    assert re.match(rf"node '{model.graph.node[0].name or op + '_0'}' \({op}\): (input|attribute) '\w+'", msg), msg
    assert any(f"input {name!r}" in msg for name in shapes), msg
    assert msg.endswith(tail) or f"{tail} (" in msg or f"{tail}," in msg, msg
    oracle = whole.reference(case, "float32") if op in NO_CPU_KERNEL else model
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises its own Fail / InvalidArgument types
        onnxruntime_outputs(oracle, case.feeds())


def test_every_unbroken_conformance_case_passes_its_validator():
    """The validators run on every case's inputs and attributes, directly: none is refused."""
    import torch

    from engine.ops.inputs import Inputs
    from engine.run.validation import input_index

    refused = []
    for case in all_cases():
        check = record(case.op, case.domain).validate
        if check is None:
            continue
        values = [None if v is None else torch.from_numpy(np.asarray(v)) for _, v in case.inputs]
        try:
            check(Inputs(input_index(case.domain, case.op, case.opset), values), **dict(case.attrs),
                  n_outputs=len(case.outputs))
        except InputShapeError as exc:
            refused.append(f"{case.name}: {exc}")
    assert not refused, "\n".join(refused)


def test_every_contrib_op_has_a_validator_and_a_broken_case():
    ops = {c.op for c in all_cases()}
    validated = {op for op in ops if record(op, next(c.domain for c in all_cases() if c.op == op)).validate}
    assert validated == ops - UNCHECKED
    assert {b[0] for b in BROKEN} == validated


def test_the_seen_bug_fake_past_of_head_size_1_is_refused_not_zeros(tmp_path):
    """GroupQueryAttention with made-up past KV of head size 1 (real 16) gave silent zeros before."""
    whole = _case("GroupQueryAttention", GQA)
    case = _broken(whole, {"past_key": (2, 2, 5, 1), "past_value": (2, 2, 5, 1)})
    path = tmp_path / "gqa.onnx"
    path.write_bytes(_model(case, whole).SerializeToString())
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **case.feeds())
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["run", str(path), "--feeds", str(feeds)])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err.getvalue()
    assert "input 'past_key' of shape [2, 2, 5, 1]: dim 3 is 1, expected 16" in lines[0]
