"""engine.lower on onnx's shipped light models: the gradients of the logits w.r.t. the input image
and three weights (random weights, random dy), float32, against the engine's own gradients.

Relu has no derivative at 0 and MaxPool none at a tie; onnxruntime's forward differs from torch's by
round-off (~1e-6), so an activation within round-off of a kink can take the other branch there and
move a gradient entry (resnet50 and inception_v1 have a few such points for every seed we tried).
So each case counts those kink decisions (Relu signs, MaxPool argmaxes) in the two forwards:
- none differ: onnxruntime's gradients must equal the engine's to 1e-5 (max error / max |gradient|);
- some differ: the engine itself runs the lowered graph (same forward, same kinks) and must match to
  1e-5, and onnxruntime must still match to 1e-2 in relative L2 norm (a wrong rule is off by O(1)).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import engine
from engine.lowering.context import attr
from tests.lowering_checks import check_valid, ort_run
from tests.run.test_light_models import _weights, _weights_as_inputs, _with_random_feeds

pytest.importorskip("onnxruntime")
TOL, L2_TOL = 1e-5, 1e-2


def _argmax(node, values: np.ndarray) -> torch.Tensor:
    k, s = attr(node, "kernel_shape"), attr(node, "strides", [1, 1])
    p = attr(node, "pads", [0, 0, 0, 0])
    padded = torch.nn.functional.pad(torch.from_numpy(values), [p[1], p[3], p[0], p[2]], value=-np.inf)
    return torch.nn.functional.max_pool2d(padded, k, s, 0, ceil_mode=bool(attr(node, "ceil_mode", 0)),
                                          return_indices=True)[1]


def kink_flips(cut, nodes_out: dict[str, np.ndarray], engine_out: dict[str, np.ndarray]) -> int:
    """Relu signs and MaxPool argmaxes that differ between two forwards of the same model."""
    flips = 0
    for n in cut.graph.node:
        t = n.input[0]
        if n.op_type == "Relu":
            flips += int(((nodes_out[t] > 0) != (engine_out[t] > 0)).sum())
        elif n.op_type == "MaxPool":
            flips += int((_argmax(n, nodes_out[t]) != _argmax(n, engine_out[t])).sum())
    return flips


def _max_rel(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["squeezenet", "inception_v1", "resnet50", "densenet121"])
def test_light_model_gradients_match_engine(stem):
    proto, model, image, feeds = _with_random_feeds(stem, seed=1)
    cut = _weights_as_inputs(proto, feeds, image)
    softmax = [n for n in proto.graph.node if n.op_type == "Softmax"]
    y = softmax[-1].input[0] if softmax else model.outputs[0]  # logits: softmax would flatten gradients
    xs = [image] + _weights(proto)
    zs = [w for w in feeds if w not in xs]
    lowered = engine.lower(cut, y, xs, zs, dy=True, check=False)
    check_valid(lowered)

    kinks = sorted({n.input[0] for n in cut.graph.node if n.op_type in ("Relu", "MaxPool")})
    probe = onnx.ModelProto()
    probe.CopyFrom(lowered)
    for t in kinks:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    shape = [d.dim_value for d in next(i for i in lowered.graph.input if i.name == f"d{y}").type.tensor_type.shape.dim]
    dy = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    fed = {**feeds, f"d{y}": dy}
    got = ort_run(probe, fed)
    want = model.gradient(y, xs, zs, feeds=feeds, dy=dy).grads
    assert all(np.abs(want[x]).max() > 0 for x in xs), "a zero gradient would make the comparison vacuous"
    names = [f"d{y}_d{x}" for x in xs]

    if kink_flips(cut, got, model.run(feeds, outputs=kinks)) == 0:
        errors = {x: _max_rel(got[n], want[x]) for x, n in zip(xs, names)}
        assert max(errors.values()) <= TOL, errors
        return
    same_forward = engine.load(lowered).run(fed, outputs=names)
    errors = {x: _max_rel(same_forward[n], want[x]) for x, n in zip(xs, names)}
    assert max(errors.values()) <= TOL, errors
    l2 = {x: float(np.linalg.norm(got[n] - want[x]) / np.linalg.norm(want[x])) for x, n in zip(xs, names)}
    assert max(l2.values()) <= L2_TOL, l2
