"""Gradients on real architectures (transformers' BERT, timm's resnet18; small configs, random
weights) exported by both torch exporters, against torch autograd on the very module exported.

timm and transformers are optional (not project dependencies): skipped where they do not import.
Exporters rename, transpose and fold weights, so initializers are matched to parameters by value.
"""
import os
import sys

import numpy as np
import pytest
import torch

from tests import paths

sys.path.insert(0, os.path.join(str(paths.ROOT), "benchmarks"))
import _real_models as real_models  # noqa: E402

import engine  # noqa: E402


def _case(name):
    return next(c for c in real_models.CASES if c.name == name)


@pytest.mark.parametrize("exporter", real_models.EXPORTERS)
@pytest.mark.parametrize("name", ["bert", "resnet18"])
def test_gradients_match_torch_on_the_exported_module(name, exporter):
    real_models.stub_torchvision()
    pytest.importorskip("timm")
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    module, x = real_models.build(_case(name))
    model = engine.load(real_models.export(module, x, exporter, cache=None))
    matched = real_models.match_weights(model, module)
    params = dict(module.named_parameters())
    assert len(matched) >= 2, "no initializer matches a parameter"
    (x_name,) = model.inputs
    float_input = x.is_floating_point()
    xs = ([x_name] if float_input else []) + sorted(matched)
    dy = torch.randn(module(x).shape, generator=torch.Generator().manual_seed(3))
    result = model.gradient(model.outputs[0], xs, [] if float_input else [x_name], feeds={x_name: x.numpy()},
                            dy=dy.numpy())
    leaves = ([x.clone().requires_grad_()] if float_input else []) + [params[matched[n][0]] for n in sorted(matched)]
    native = torch.autograd.grad(module(leaves[0] if float_input else x), leaves, dy)
    scale = max(float(g.abs().max()) for g in native)
    for n, g in zip(xs, native):
        if n in matched and matched[n][1]:
            g = g.t()
        np.testing.assert_allclose(result.grads[n], g.numpy(), rtol=2e-3, atol=1e-4 * scale, err_msg=n)
