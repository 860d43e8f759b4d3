"""torch modules for bench_verify's comparison with gradcheck on the module itself: the CNNs a user
would otherwise check with torch.autograd.gradcheck, each exported to ONNX for onnxgrad.

- relu_cnn: Conv ReLU MaxPool Conv ReLU GlobalAveragePool Linear, then a scalar loss averaged over
  the batch (squared error against one-hot targets, or cross-entropy with reduction=mean);
- tanh_cnn: tests/verify_models.small_cnn written in torch with its weights (per-row logits y [B, 10]).
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn


@dataclass(frozen=True)
class NativeCase:
    name: str
    module: nn.Module  # float64, called as module(x, *rest)
    x: torch.Tensor  # float64
    rest: tuple  # further inputs, not differentiated (targets)
    proto: onnx.ModelProto
    y: str
    zs: tuple[str, ...]

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        return {"x": self.x.numpy(), **{z: r.numpy() for z, r in zip(self.zs, self.rest)}}


class ReluCnn(nn.Module):
    def __init__(self, loss: str):
        super().__init__()
        self.loss = loss
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x, t):
        z = self.features(x)
        if self.loss == "cross_entropy":
            return nn.functional.cross_entropy(z, t)
        return ((z - nn.functional.one_hot(t, 10).to(z.dtype)) ** 2).sum(1).mean()


class TanhCnn(nn.Module):
    """small_cnn's graph: Conv(3->8) Tanh MaxPool Conv(8->16) Tanh GlobalAveragePool Flatten MatMul."""

    def __init__(self, proto: onnx.ModelProto):
        super().__init__()
        w = {t.name: torch.from_numpy(numpy_helper.to_array(t).astype(np.float64)) for t in proto.graph.initializer}
        self.w1, self.w2, self.fc = nn.Parameter(w["w1"]), nn.Parameter(w["w2"]), nn.Parameter(w["fc"])

    def forward(self, x):
        a = torch.tanh(nn.functional.conv2d(x, self.w1, padding=1))
        a = torch.tanh(nn.functional.conv2d(nn.functional.max_pool2d(a, 2), self.w2, padding=1))
        return a.mean((2, 3)) @ self.fc


def relu_cnn(loss: str, batch: int = 8, side: int = 16) -> NativeCase:
    torch.manual_seed(0)
    module = ReluCnn(loss)
    x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(1))
    t = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x, t), buf, input_names=["x", "t"], output_names=["loss"], opset_version=17,
                          dynamo=False)
    name = f"ReLU CNN, {'cross-entropy' if loss == 'cross_entropy' else 'squared error'} mean, x {batch}x3x{side}x{side}"
    return NativeCase(name, module.double(), x.double(), (t,), onnx.load_from_string(buf.getvalue()), "loss", ("t",))


def tanh_cnn(proto: onnx.ModelProto, batch: int = 8) -> NativeCase:
    x = torch.randn((batch, 3, 16, 16), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return NativeCase(f"small CNN (Tanh), per-row y {batch}x10, x {batch}x3x16x16", TanhCnn(proto), x, (), proto, "y", ())


def cases(small_cnn_proto: onnx.ModelProto) -> list[NativeCase]:
    """The issue-21 target (squared error, x 8x3x16x16), its neighbours (cross-entropy; a batch of
    16), and the per-row CNN."""
    return [relu_cnn("squared_error"), relu_cnn("cross_entropy"), relu_cnn("squared_error", batch=16),
            tanh_cnn(small_cnn_proto)]
