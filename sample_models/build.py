"""Rebuild every sample model in this folder, byte for byte.

    python sample_models/build.py           # write the .onnx files
    python sample_models/build.py --check   # exit 1 if a committed file differs from a fresh build

Each model is written with onnx.helper from fixed seeds, with the IR version, opsets and producer
fixed, so the bytes depend on nothing but this script (never on the installed torch or onnx
exporter). `SAMPLES` is the catalogue: the selection each sample is meant for, the feeds it needs
and the verdict `onnxgrad check` should reach on it; tests/run/test_samples.py reads it.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from onnx import ModelProto

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # the builders sit beside this script; tests import it by path
    sys.path.insert(0, HERE)

import architectures  # noqa: E402
import spec_diagrams  # noqa: E402
from graphs import float16  # noqa: E402


@dataclass(frozen=True)
class Sample:
    """One sample model and the selection it teaches. Feeds are CLI SPEC strings (NAME -> SPEC)."""

    name: str
    build: Callable[[], ModelProto]
    teaches: str
    y: str
    xs: tuple[str, ...]
    zs: tuple[str, ...] = ()
    feeds: dict[str, str] = field(default_factory=dict)
    claimed: dict[str, str] = field(default_factory=dict)  # x -> graph output holding a claimed dy/dx
    verdict: str = "pass"  # what `onnxgrad check` must conclude: pass, fail or inconclusive

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"

    def cli_args(self) -> list[str]:
        """Arguments after the model path for `onnxgrad grad` / `onnxgrad check`."""
        args = ["--y", self.y, "--xs", ",".join(self.xs)]
        if self.zs:
            args += ["--zs", ",".join(self.zs)]
        for name, spec in self.feeds.items():
            args += ["--feed", f"{name}={spec}"]
        return args


SAMPLES: tuple[Sample, ...] = (
    Sample("spec_conv_gemm", spec_diagrams.conv_gemm,
           "The spec's first diagram: Conv -> H -> Gemm with Gradient(xs=[W,Z], zs=[X], y=Y)",
           y="Y", xs=("W", "Z"), zs=("X",), feeds={"X": "random:1"}),
    Sample("spec_grad_wrt_h", spec_diagrams.grad_wrt_h,
           "Gradient w.r.t. the intermediate H, evaluated at a fed value H_1",
           y="Y", xs=("H", "Z"), feeds={"X": "random:1"}),
    Sample("spec_second_order", spec_diagrams.second_order,
           "Nested Gradient nodes: d2O/dW2 of a linear model with a squared-error loss",
           y="O", xs=("X", "W"), zs=("L",)),
    Sample("spec_optional_output", spec_diagrams.optional_output,
           "A Gradient node whose first output is skipped with an empty name",
           y="Y", xs=("W", "Z"), zs=("X",), feeds={"X": "random:1"}),
    Sample("mlp", architectures.mlp,
           "Two Gemm layers, Relu, LogSoftmax cross-entropy: the everyday training gradient",
           y="loss", xs=("W1", "b1", "W2", "b2"), zs=("X", "T")),
    Sample("small_cnn", architectures.small_cnn,
           "Conv, BatchNormalization, MaxPool, AveragePool, Relu, Gemm; a non-scalar y (logits)",
           y="logits", xs=("X", "conv1_W", "bn_scale", "bn_B", "fc_W")),
    Sample("transformer_block", architectures.transformer_block,
           "Pre-norm attention block: LayerNormalization, MatMul, Softmax, Reshape/Transpose heads, Erf GELU, residuals",
           y="loss", xs=("X", "Wq", "Wk", "Wv", "Wo", "ln1_scale", "W1", "W2")),
    Sample("transformer_block_fp16", lambda: float16(architectures.transformer_block()),
           "The same block in float16: run and differentiated in float16, the gradient judged within float16's precision",
           y="loss", xs=("X", "Wq", "ln1_scale", "W2")),
    Sample("lstm_step", architectures.lstm_step,
           "One LSTM time step: gradients w.r.t. the weights and the incoming state",
           y="loss", xs=("X", "W", "R", "B", "initial_h", "initial_c")),
    Sample("residual_fanout", architectures.residual_fanout,
           "Fan-out: X feeds a MatMul and a residual Add, W is used twice; gradients accumulate",
           y="loss", xs=("X", "W")),
    Sample("kinks", architectures.kinks,
           "Relu, Max and Abs evaluated exactly at their kinks: finite differences are inconclusive",
           y="loss", xs=("X", "Y"), verdict="inconclusive"),
    Sample("handwritten_backward", architectures.handwritten_backward,
           "A model that computes its own gradients (dW, dX) with ordinary ops: a claimed gradient",
           y="y", xs=("W", "X"), claimed={"W": "dW", "X": "dX"}),
    Sample("handwritten_backward_bug", architectures.handwritten_backward_bug,
           "The same with a deliberate bug (dX forgets to transpose W): the verifier must fail it",
           y="y", xs=("W", "X"), claimed={"W": "dW", "X": "dX"}, verdict="fail"),
)


def by_name(name: str) -> Sample:
    for s in SAMPLES:
        if s.name == name:
            return s
    raise KeyError(f"no sample {name!r}; samples: {', '.join(s.name for s in SAMPLES)}")


def serialized(sample: Sample) -> bytes:
    return sample.build().SerializeToString()


def build_all() -> dict[str, bytes]:
    """File name -> bytes, for every sample."""
    return {s.filename: serialized(s) for s in SAMPLES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    parser.add_argument("--dir", default=HERE, help="folder to write to or compare with (default: this one)")
    args = parser.parse_args(argv)
    stale = []
    for filename, data in build_all().items():
        path = os.path.join(args.dir, filename)
        if args.check:
            current = open(path, "rb").read() if os.path.exists(path) else None
            if current != data:
                stale.append(filename)
            continue
        with open(path, "wb") as fh:
            fh.write(data)
        print(f"wrote {filename} ({len(data):,} bytes)")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python sample_models/build.py)", file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(SAMPLES)} sample models are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
