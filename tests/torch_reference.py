"""An independent oracle: the opset-9 CNN ops of ONNX's `light/` models written directly with torch.nn.functional.

It shares no code with engine/ops: it is the "same network written in torch" that the engine's
values and gradients are compared against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper


def _pads(node_attrs, n=2):
    pads = node_attrs.get("pads", [0] * 2 * n)
    return pads[:n], pads[n:]


def _conv(x, w, b=None, **a):
    begin, end = _pads(a)
    if begin != end:
        x = F.pad(x, [begin[1], end[1], begin[0], end[0]])
        begin = [0, 0]
    return F.conv2d(x, w, b, stride=a.get("strides", 1), padding=begin, dilation=a.get("dilations", 1),
                    groups=a.get("group", 1))


def _maxpool(x, **a):
    begin, end = _pads(a)
    x = F.pad(x, [begin[1], end[1], begin[0], end[0]], value=float("-inf"))
    return F.max_pool2d(x, a["kernel_shape"], a.get("strides", 1))


def _avgpool(x, **a):
    begin, end = _pads(a)
    k, s = a["kernel_shape"], a.get("strides", 1)
    if begin == end:
        return F.avg_pool2d(x, k, s, padding=begin, count_include_pad=bool(a.get("count_include_pad", 0)))
    pad = [begin[1], end[1], begin[0], end[0]]
    total = F.avg_pool2d(F.pad(x, pad), k, s)
    if a.get("count_include_pad", 0):
        return total
    return total / F.avg_pool2d(F.pad(torch.ones_like(x), pad), k, s)


def _gemm(a, b, c=None, transA=0, transB=0, alpha=1.0, beta=1.0):
    a = a.t() if transA else a
    b = b.t() if transB else b
    out = alpha * (a @ b)
    return out if c is None else out + beta * c


def _softmax(x, axis=1):
    shape = x.shape
    return F.softmax(x.reshape(int(torch.tensor(shape[:axis]).prod()), -1), dim=1).reshape(shape)


def _reshape(x, shape):
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape.tolist())]
    return x.reshape(shape)


def _unsqueeze(x, axes):
    for ax in sorted(axes):
        x = x.unsqueeze(ax)
    return x


ORACLE = {
    "Conv": _conv,
    "MaxPool": _maxpool,
    "AveragePool": _avgpool,
    "GlobalAveragePool": lambda x: x.mean(dim=(2, 3), keepdim=True),
    "Relu": lambda x: F.relu(x),
    "BatchNormalization": lambda x, s, b, m, v, epsilon=1e-5, **_: F.batch_norm(x, m, v, s, b, False, 0.0, epsilon),
    "Gemm": _gemm,
    "Softmax": _softmax,
    "LRN": lambda x, size, alpha=1e-4, beta=0.75, bias=1.0: F.local_response_norm(x, size, alpha, beta, bias),
    "Dropout": lambda x, **_: x,
    "Reshape": _reshape,
    "Concat": lambda *xs, axis: torch.cat(xs, dim=axis),
    "Sum": lambda *xs: sum(xs[1:], xs[0]),
    "Add": lambda a, b: a + b,
    "Mul": lambda a, b: a * b,
    "Unsqueeze": _unsqueeze,
    "Transpose": lambda x, perm: x.permute(perm),
    "ConstantOfShape": lambda s, value: torch.full(s.tolist(), float(numpy_helper.to_array(value).item())),
}


def run(model, values: dict[str, torch.Tensor], targets: list[str], dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Evaluate `model` with torch; `values` override any tensor (nodes producing them are skipped)."""
    env = {}
    for init in model.graph.initializer:
        t = torch.from_numpy(numpy_helper.to_array(init).copy())
        env[init.name] = t.to(dtype) if t.is_floating_point() else t
    env.update(values)
    for node in model.graph.node:
        if all(o in values for o in node.output):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs.pop("is_test", None)
        attrs.pop("spatial", None)
        out = ORACLE[node.op_type](*[env[i] for i in node.input if i], **attrs)
        if isinstance(out, tuple):
            out = out[0]
        env[node.output[0]] = out
    return {t: env[t] for t in targets}
