"""The documented extension (docs/semantics.md): an x that zs determine is allowed when every path
from those zs to y around x is non-differentiable; the gradient is torch.autograd's on the same
graph at x's forward value. Gradient nodes inside a model keep the strict reading.

The hand-built case runs in CI; GPT-2 and BERT (transformers, skipped where it does not import)
are checked against transformers' own gradient with respect to `inputs_embeds`.
"""
from __future__ import annotations

import io
import os
import sys
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import engine
from engine.errors import SelectionError
from tests import paths
from tests.debug_models import float_shortcut, token_embeddings, token_embeddings_oracle

IDS = np.array([[3, 1, 6, 0, 2], [5, 5, 4, 1, 0]], np.int64)
MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], np.int64)


@pytest.fixture(scope="module")
def lm():
    return engine.load(token_embeddings())


def test_embeddings_are_allowed_and_the_spec_says_why(lm):
    spec = lm.selection("y", ["x"], ["input_ids", "attention_mask"])
    (d,) = spec.determined
    assert (d.x, d.by, d.through) == ("x", ("input_ids",), ("'input_ids' → Shape 'shape'",))
    assert "allowed as an extension" in d.note


def test_gradient_is_torch_autograd_at_the_forward_value(lm):
    dy = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    result = lm.gradient("y", ["x"], ["input_ids", "attention_mask"], feeds={"input_ids": IDS, "attention_mask": MASK},
                         dy=dy, dtype="float64")
    np.testing.assert_allclose(result.grads["x"], token_embeddings_oracle(IDS, MASK, dy), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(result.values["x"], lm.run({"input_ids": IDS}, outputs=["x"], dtype="float64")["x"])


def test_check_agrees_with_finite_differences(lm):
    report = engine.check(lm, "y", ["x"], ["input_ids", "attention_mask"], feeds={"input_ids": IDS, "attention_mask": MASK})
    assert report.verdict == "pass", report.summary()


@pytest.mark.parametrize("through_shape", [True, False])
def test_a_float_z_is_allowed_only_when_its_paths_around_x_carry_no_derivative(through_shape):
    model = engine.load(float_shortcut(through_shape))
    if through_shape:
        (d,) = model.selection("y", ["x"], ["F"]).determined
        assert d.through == ("'F' → Shape 'shape'",)
        assert model.gradient("y", ["x"], ["F"], feeds={"F": np.ones(3, np.float32)}).grads["x"].tolist() == [1, 1, 1]
    else:
        with pytest.raises(SelectionError, match="'x' cannot be in xs: it is determined by 'F', so it is not an "
                                                 "independent variable"):
            model.selection("y", ["x"], ["F"])


def test_the_spec_examples_stay_refused():
    model = engine.load("sample_models/spec_conv_gemm.onnx")
    with pytest.raises(SelectionError, match="'H' cannot be in xs: it is determined by 'X'"):
        model.selection("Y", ["H"], ["Z", "X"])  # X reaches Y only through H: listing it is needless
    lm = engine.load(token_embeddings())
    with pytest.raises(SelectionError, match="determined by 'E' and 'input_ids'"):
        lm.selection("y", ["x", "E"], ["input_ids", "attention_mask"])  # determined by a member of xs


def test_gradient_nodes_keep_the_strict_reading():
    proto = token_embeddings()
    proto.graph.node.append(helper.make_node("Gradient", ["x", "input_ids", "attention_mask"], ["dy_dx"],
                                             domain="ai.onnx.preview.training", xs=["x"],
                                             zs=["input_ids", "attention_mask"], y="y", name="grad"))
    proto.opset_import.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    proto.graph.output.append(helper.make_tensor_value_info("dy_dx", onnx.TensorProto.FLOAT, None))
    with pytest.raises(SelectionError, match="Gradient node 'grad': 'x' cannot be in xs: it is determined by 'input_ids'"):
        engine.load(proto, check=False)


# --- transformers: the gradient every attribution method starts from --------------------------------
sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))


class _Wrapped(torch.nn.Module):
    def __init__(self, model, out: str):
        super().__init__()
        self.m, self.out = model, out

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None):
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds)
        return getattr(out, self.out)


def _transformers_model(kind: str):
    import _real_models

    _real_models.stub_torchvision()
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_inner=64, vocab_size=50, n_positions=32,
                               use_cache=False)
        return _Wrapped(tf.GPT2LMHeadModel(config), "logits").eval(), "transformer.wte.weight"
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=50, max_position_embeddings=32)
    return _Wrapped(tf.BertModel(config, add_pooling_layer=False), "last_hidden_state").eval(), \
        "embeddings.word_embeddings.weight"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_embedding_gradient_matches_transformers_inputs_embeds(kind):
    module, table = _transformers_model(kind)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask), buf, input_names=["input_ids", "attention_mask"], output_names=["out"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    model = engine.load(buf.getvalue())
    weight = dict(module.m.named_parameters())[table].detach()
    (x,) = [n.output[0] for n in model.graph.nodes if n.op_type == "Gather" and n.input[0] in model.graph.initializers
            and torch.equal(model.constants()[n.input[0]], weight)]
    spec = model.selection("out", [x], model.inputs)
    assert spec.determined and spec.determined[0].by == ("input_ids",)
    embeds = weight[ids].clone().requires_grad_()
    out = module(attention_mask=mask, inputs_embeds=embeds)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (expected,) = torch.autograd.grad(out, embeds, dy)
    result = model.gradient("out", [x], model.inputs, feeds={"input_ids": ids.numpy(), "attention_mask": mask.numpy()},
                            dy=dy.numpy())
    scale = float(expected.abs().max())
    np.testing.assert_allclose(result.grads[x], expected.numpy(), rtol=1e-3, atol=1e-5 * scale)
