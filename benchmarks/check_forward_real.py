"""J·v and H·v of real timm/transformers exports against torch.func on the module that was exported
(issue 36's accuracy targets): relative L2 error ≤ 1e-6 in float64 and ≤ 1e-4 in float32.

Each architecture of the lowering survey (benchmarks/_real_models.py, random perturbed weights) is
exported by both torch exporters. xs: the input when it is float, and three weights matched to the
module's parameters by value (the first, the middle and the last); random tangents. J·v in float64
and float32 against `torch.func.jvp` of the module in the same dtype; H·v of Σ y² (two nodes added
to the file, the same expression in torch) in float64 against `torch.func.jvp(torch.func.grad(...))`.

    python benchmarks/check_forward_real.py [--models bert,resnet18] [--exporters torchscript,dynamo] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings

import numpy as np
import onnx
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import _real_models as real_models  # noqa: E402
from _results import write_json  # noqa: E402
from bench_forward import rel, squared_loss  # noqa: E402

import engine  # noqa: E402

DEFAULT_JSON = os.path.join(HERE, "results", "forward_real.json")


@contextlib.contextmanager
def float64_throughout():
    """transformers' RMS norms and rotary tables compute in float32 whatever the module's dtype
    (`hidden_states.to(torch.float32)`), so a `.double()` Llama or T5 is only float32-accurate: for
    the float64 reference they compute in their input's dtype, the same math written directly. And
    nn.Hardsigmoid as relu6(x + 3) / 6, which torch can differentiate twice."""
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.t5 import modeling_t5 as t5

    def rms(self, h):
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + getattr(self, "variance_epsilon", 1e-6)))

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(device=x.device, dtype=x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def hardsigmoid(self, x):  # torch's kernel has no second derivative at all; the same function
        return torch.nn.functional.relu6(x + 3) / 6

    saved = [(llama.LlamaRMSNorm, "forward"), (llama.LlamaRotaryEmbedding, "forward"), (t5.T5LayerNorm, "forward"),
             (torch.nn.Hardsigmoid, "forward")]
    originals = [getattr(c, n) for c, n in saved]
    llama.LlamaRMSNorm.forward, llama.LlamaRotaryEmbedding.forward, t5.T5LayerNorm.forward = rms, rotary, rms
    torch.nn.Hardsigmoid.forward = hardsigmoid
    try:
        yield
    finally:
        for (c, n), f in zip(saved, originals):
            setattr(c, n, f)


def pick(matched: dict) -> list[str]:
    names = list(matched)
    return list(dict.fromkeys([names[0], names[len(names) // 2], names[-1]])) if names else []


def one(case, exporter: str) -> dict:
    module, x = real_models.build(case)
    module.requires_grad_(False)
    data = real_models.export(module, x, exporter)
    model = engine.load(data)
    matched = real_models.match_weights(model, module)
    weights = pick(matched)
    (x_name,) = model.inputs
    floating = x.is_floating_point()
    xs = ([x_name] if floating else []) + weights
    zs = [] if floating else [x_name]
    y_name = model.outputs[0]
    rng = np.random.default_rng(0)
    values = {x_name: x} if floating else {}
    for w in weights:
        pname, transposed = matched[w]
        p = dict(module.named_parameters())[pname].detach()
        values[w] = p.t() if transposed else p
    tangents = {n: rng.standard_normal(tuple(values[n].shape)) for n in xs}

    def f_of(mod, dtype):
        def f(*vals):
            given = dict(zip(xs, vals))
            params = {matched[w][0]: (given[w].t() if matched[w][1] else given[w]) for w in weights}
            inp = given.get(x_name, x.to(dtype) if floating else x)
            return torch.func.functional_call(mod, params, (inp,))
        return f

    row = {"model": case.name, "exporter": exporter, "xs": len(xs), "nodes": len(model.graph.nodes)}
    for dtype, label in ((torch.float64, "float64"), (torch.float32, "float32")):
        mod = module.to(dtype)
        primal = tuple(values[n].to(dtype) if n != x_name else x.to(dtype) for n in xs)
        t = tuple(torch.from_numpy(tangents[n]).to(dtype) for n in xs)
        with float64_throughout() if dtype == torch.float64 else contextlib.nullcontext():
            _, want = torch.func.jvp(f_of(mod, dtype), primal, t)
        feeds = {x_name: x.numpy()}
        got = model.jvp(y_name, xs, {n: tangents[n].astype(np.float32) if label == "float32" else tangents[n]
                                     for n in xs}, zs, feeds=feeds, dtype=label)
        row[f"jvp_error_{label}"] = rel(got.jvp, want.detach().numpy())
    mod = module.to(torch.float64)
    primal = tuple(values[n].double() if n != x_name else x.double() for n in xs)

    def loss(*vals):
        out = f_of(mod, torch.float64)(*vals)
        return (out * out).sum()

    directions = tuple(torch.from_numpy(tangents[n]) for n in xs)
    with float64_throughout():
        _, want = torch.func.jvp(torch.func.grad(loss, argnums=tuple(range(len(xs)))), primal, directions)
    loss_model = engine.load(squared_loss(onnx.load_from_string(data), y_name))
    got = loss_model.hvp("hvp_loss", xs, tangents, zs, feeds={x_name: x.numpy()}, dtype="float64")
    row["hvp_error_float64"] = rel(np.concatenate([got.hvp[n].ravel() for n in xs]),
                                   np.concatenate([w.detach().numpy().ravel() for w in want]))
    module.to(torch.float32)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(c.name for c in real_models.LOWERING_CASES))
    p.add_argument("--exporters", default="torchscript,dynamo")
    p.add_argument("--json", default=DEFAULT_JSON)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    real_models.stub_torchvision()
    torch.backends.mha.set_fastpath_enabled(False)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    by_name = {c.name: c for c in real_models.LOWERING_CASES}
    rows = []
    with sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False):
        for name in args.models.split(","):
            for exporter in args.exporters.split(","):
                t = time.perf_counter()
                try:
                    row = one(by_name[name], exporter)
                except Exception as exc:  # an export torch refuses, an op the engine lacks: recorded
                    row = {"model": name, "exporter": exporter, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                row["seconds"] = round(time.perf_counter() - t, 1)
                ok = "error" not in row and row["jvp_error_float64"] <= 1e-6 and row["jvp_error_float32"] <= 1e-4 \
                    and row["hvp_error_float64"] <= 1e-6
                row["within_target"] = ok
                print(row, flush=True)
                rows.append(row)
    write_json(args.json, {"benchmark": "forward_real", "rows": rows})
    met = sum(r["within_target"] for r in rows)
    print(f"{met} of {len(rows)} exports within the targets")
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
