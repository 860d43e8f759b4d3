"""Generated cases for the com.microsoft sweep: per op at least 20 nodes over shapes, attributes and
optional inputs and outputs, seeded so a run is reproducible. Attention-family cases are in
contrib_cases_attention.py. Each case names the inputs whose gradient is checked (its xs): the float
inputs, with integer weights, indices and masks left out.
"""
from __future__ import annotations

import dataclasses
import itertools
from functools import lru_cache

import numpy as np

from .contrib_case import ContribCase, make, normal, rng_for
from .contrib_cases_attention import attention_cases
from .contrib_cases_quant import quant_cases
from .contrib_oracles import bias_add_reference, bias_split_gelu_reference, gemm_fast_gelu_reference

SHAPES = [(7,), (2, 5), (2, 3, 8), (1, 4, 2, 6), (3, 16)]


def _gelu_family():
    out = []
    for op in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu"):
        rng = rng_for(op)
        alphas = [None, 1.0, 0.5, -1.2]
        for (k, shape), scale in itertools.product(enumerate(SHAPES), (1.0, 3.0, 0.2, 6.0)):
            values = {"X": normal(rng, *shape, scale=scale), "A": normal(rng, *shape, scale=scale)}
            attrs = {}
            if op == "BiasGelu":
                values["B"] = normal(rng, shape[-1])
            if op == "FastGelu" and (k + int(scale)) % 2 == 0:
                values["bias"] = normal(rng, shape[-1])
            if op == "QuickGelu" and alphas[k % 4] is not None:
                attrs["alpha"] = alphas[k % 4]
            label = f"{'x'.join(map(str, shape))}-s{scale:g}" + ("-bias" if "bias" in values else "") + \
                (f"-alpha{attrs['alpha']:g}" if attrs else "")
            out.append(make(op, label, values, attrs))
    return out


def _bias_ops():
    out = []
    shapes = [(1, 4, 8), (2, 3, 6), (2, 1, 10), (3, 5, 4), (1, 2, 32)]
    for op, ref in (("BiasAdd", bias_add_reference), ("BiasSplitGelu", bias_split_gelu_reference)):
        rng = rng_for(op)
        for shape, scale in itertools.product(shapes, (1.0, 2.5, 0.3, 5.0)):
            values = {"X": normal(rng, *shape, scale=scale), "bias": normal(rng, shape[-1])}
            if op == "BiasAdd":
                values["skip"] = normal(rng, *shape)
            out.append(make(op, f"{'x'.join(map(str, shape))}-s{scale:g}", values, reference=ref))
    rng = rng_for("GemmFastGelu")
    for (m, k, n), rank3, bias in itertools.product([(3, 4, 5), (1, 8, 2), (4, 6, 6), (2, 3, 9), (5, 2, 3)],
                                                    (False, True), (False, True)):
        x = normal(rng, 2, m, k) if rank3 else normal(rng, m, k)
        values = {"X": x, "W": normal(rng, k, n, scale=0.7), "bias": normal(rng, n) if bias else None}
        out.append(make("GemmFastGelu", f"{'x'.join(map(str, x.shape))}-W{k}x{n}" + ("-bias" if bias else ""), values,
                        reference=gemm_fast_gelu_reference))
    return out


def _fused_matmul():
    rng = rng_for("FusedMatMul")
    out = []
    for rank, ta, tb, batch_a, batch_b, alpha in [
            (2, 0, 0, 0, 0, 1.0), (2, 1, 0, 0, 0, 0.5), (2, 0, 1, 0, 0, 2.0), (2, 1, 1, 0, 0, -1.0),
            (3, 0, 0, 0, 0, 1.0), (3, 1, 0, 0, 0, 1.5), (3, 0, 1, 0, 0, 1.0), (3, 1, 1, 0, 0, 0.25),
            (4, 0, 0, 0, 0, 1.0), (4, 0, 1, 0, 0, 0.125), (3, 0, 0, 1, 0, 1.0), (3, 1, 0, 1, 0, 1.0),
            (3, 0, 0, 0, 1, 2.0), (3, 0, 1, 0, 1, 1.0), (3, 0, 0, 1, 1, 1.0), (4, 0, 0, 1, 0, 0.5),
            (4, 0, 1, 0, 1, 1.0), (4, 1, 1, 1, 1, 1.0), (1, 0, 0, 0, 0, 1.0), (3, 0, 1, 0, 0, 3.0)]:
        m, k, n, b1, b2 = 3, 4, 5, 2, 3
        batch = {2: (), 3: (b1,), 4: (b1, b2), 1: ()}[rank]
        a_shape = list(batch) + ([k, m] if ta else [m, k])
        b_shape = list(batch) + ([n, k] if tb else [k, n])
        if rank == 1:
            a_shape, b_shape = [k], [k, n]
        if batch_a:  # the leading axis sits next to the last: [b.., m, K] read from [m, b.., K]
            a_shape = [a_shape[-2]] + a_shape[:-2] + [a_shape[-1]]
        if batch_b:
            b_shape = [b_shape[-2]] + b_shape[:-2] + [b_shape[-1]]
        attrs = {"transA": ta, "transB": tb, "transBatchA": batch_a, "transBatchB": batch_b, "alpha": alpha}
        attrs = {k_: v for k_, v in attrs.items() if v != (1.0 if k_ == "alpha" else 0)}
        label = f"r{rank}-" + "-".join(f"{k_}{v:g}" for k_, v in sorted(attrs.items())) if attrs else f"r{rank}"
        out.append(make("FusedMatMul", label, {"A": normal(rng, *a_shape), "B": normal(rng, *b_shape)}, attrs))
    return out


def _conv_out(sizes, geo, kernel=3):
    pads = geo.get("pads", [0] * 4)
    strides, dilations = geo.get("strides", [1, 1]), geo.get("dilations", [1, 1])
    return [(n + pads[i] + pads[i + 2] - dilations[i] * (kernel - 1) - 1) // strides[i] + 1
            for i, n in enumerate(sizes)]


def _fused_conv():
    rng = rng_for("FusedConv")
    out = []
    acts = [(None, None), ("Relu", None), ("Tanh", None), ("Sigmoid", None), ("LeakyRelu", [0.2]),
            ("Clip", [-0.5, 0.8]), ("HardSigmoid", [0.3, 0.45])]
    geometry = [dict(), dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2]), dict(dilations=[2, 1], pads=[0, 1, 0, 1]),
                dict(group=2)]
    for k, (act, params) in enumerate(acts * 3 + acts[:1]):
        geo = geometry[k % len(geometry)]
        groups = geo.get("group", 1)
        x = normal(rng, 1 + k % 2, 4, 6, 5)
        w = normal(rng, 4, 4 // groups, 3, 3, scale=0.4)
        values = {"X": x, "W": w, "B": normal(rng, 4) if k % 3 != 1 else None}
        attrs = dict(geo, kernel_shape=[3, 3])
        if act:
            attrs["activation"] = act
        if params:
            attrs["activation_params"] = params
        if k % 2:  # the fused Add: Z like the output
            values["Z"] = normal(rng, x.shape[0], 4, *_conv_out(x.shape[2:], geo))
        label = f"{act or 'none'}-" + "-".join(f"{n}{v}" for n, v in geo.items()) + ("-Z" if "Z" in values else "") + \
            ("-noB" if values["B"] is None else "")
        out.append(make("FusedConv", label.replace(" ", ""), values, attrs))
    return out


def _skip_norms():
    out = []
    for op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        rng = rng_for(op)
        simplified = op.startswith("SkipSimplified")
        for k in range(24):
            hidden = (8, 16, 5, 32)[k % 4]
            rank2 = k % 6 == 5
            shape = (6, hidden) if rank2 else (2, 3, hidden)
            skip_shape = shape if rank2 or k % 3 == 0 else ((1, 3, hidden) if k % 3 == 1 else (3, hidden))
            values = {"input": normal(rng, *shape, shift=0.5 * (k % 3)), "skip": normal(rng, *skip_shape),
                      "gamma": normal(rng, hidden, shift=1.0)}
            if not simplified and k % 2 == 0:
                values["beta"] = normal(rng, hidden)
            if k % 4 in (1, 2):
                values["bias"] = normal(rng, hidden)
            attrs = {"epsilon": 1e-5} if k % 5 == 3 else {}
            n_out = 1 + k % 4
            label = f"{'x'.join(map(str, shape))}-skip{'x'.join(map(str, skip_shape))}-out{n_out}" + \
                "".join(f"-{n}" for n in ("beta", "bias") if n in values) + ("-eps" if attrs else "")
            out.append(make(op, label, values, attrs, n_outputs=n_out))
    return out


def _layer_norms():
    out = []
    for op, n_max in (("SimplifiedLayerNormalization", 2), ("LayerNormalization", 3)):
        rng = rng_for(op)
        for k in range(20):
            shape = [(2, 3, 8), (4, 6), (2, 2, 3, 4), (5, 16)][k % 4]
            axis = [-1, 1, -2, 0][(k // 4) % 4] if k % 4 != 1 else [-1, 1][k // 4 % 2]
            axis_pos = axis % len(shape)
            norm_shape = shape[axis_pos:]
            values = {"X": normal(rng, *shape, shift=0.3 * (k % 3)), "scale": normal(rng, *norm_shape, shift=1.0),
                      "Scale": normal(rng, *norm_shape, shift=1.0)}
            if op == "LayerNormalization" and k % 3 != 2:
                values["B"] = normal(rng, *norm_shape)
            attrs = {"axis": axis}
            if k % 5 == 2:
                attrs["epsilon"] = 1e-3
            n_out = 1 + k % n_max
            label = f"{'x'.join(map(str, shape))}-axis{axis}-out{n_out}" + ("-B" if "B" in values else "") + \
                ("-eps" if "epsilon" in attrs else "")
            out.append(make(op, label, values, attrs, n_outputs=n_out, domain="", opset=16))
    return out


def _embed_layer_norm():
    rng = rng_for("EmbedLayerNormalization")
    out = []
    for k in range(20):
        batch, seq, hidden, vocab = 1 + k % 3, (4, 3, 6, 5)[k % 4], (8, 4, 6)[k % 3], 11
        values = {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
                  "word_embedding": normal(rng, vocab, hidden), "position_embedding": normal(rng, 8, hidden),
                  "gamma": normal(rng, hidden, shift=1.0), "beta": normal(rng, hidden)}
        if k % 2 == 0:
            values["segment_ids"] = rng.integers(0, 2, (batch, seq)).astype(np.int32)
            values["segment_embedding"] = normal(rng, 2, hidden)
        if k % 3 != 1:
            values["mask"] = rng.integers(0, 2, (batch, seq)).astype(np.int32)
        if k % 4 == 3:
            values["position_ids"] = rng.integers(0, 8, (batch if k % 8 == 3 else 1, seq)).astype(np.int32)
        attrs = {"epsilon": 1e-5} if k % 5 == 4 else {}
        n_out = (2, 3)[k % 2]
        label = f"{batch}x{seq}x{hidden}-out{n_out}" + "".join(
            f"-{n}" for n in ("segment_ids", "mask", "position_ids") if n in values) + ("-eps" if attrs else "")
        out.append(make("EmbedLayerNormalization", label, values, attrs, n_outputs=n_out))
    return out


@lru_cache(maxsize=1)
def all_cases() -> tuple[ContribCase, ...]:
    cases = (_gelu_family() + _bias_ops() + _fused_matmul() + _fused_conv() + _skip_norms() + _layer_norms()
             + _embed_layer_norm() + attention_cases() + quant_cases())
    seen: dict[str, int] = {}
    unique = []
    for case in cases:  # two draws of one configuration differ in their values: number the repeats
        seen[case.name] = seen.get(case.name, 0) + 1
        unique.append(case if seen[case.name] == 1 else dataclasses.replace(case, label=f"{case.label}-{seen[case.name]}"))
    return tuple(unique)


def cases_for(ops) -> list[ContribCase]:
    wanted = {o.lower().split("::")[-1] for o in ops}
    return [c for c in all_cases() if c.op.lower() in wanted]


def op_domains() -> dict[str, str]:
    return {c.op: c.domain for c in all_cases()}


def op_oracles() -> dict[str, str]:
    """Per op, what its forward was compared with."""
    counts: dict[str, list[int]] = {}
    for c in all_cases():
        total, decomposed = counts.setdefault(c.op, [0, 0])
        counts[c.op] = [total + 1, decomposed + (c.reference is not None)]
    out = {}
    for op, (total, decomposed) in counts.items():
        if not decomposed:
            out[op] = "CPU kernel"
        elif decomposed == total:
            out[op] = "ai.onnx decomposition"
        else:
            out[op] = f"CPU kernel ({decomposed} by an equivalent graph)"
    return out
