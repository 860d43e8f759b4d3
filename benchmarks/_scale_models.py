"""Pretrained-size models (full timm/transformers configs, random perturbed weights), exported once by
`torch.onnx.export` with dynamic axes and cached on disk, for the benchmarks that measure cost against
a model's bytes (bench_scale.py; the explorer's and renderer's large-model timings).

    python benchmarks/_scale_models.py build [NAME ...]   # export what is missing (GPT-2 large: ~7 GB RAM, once)
    python benchmarks/_scale_models.py list               # where each model is, and its bytes

Nothing is downloaded: the configs are transformers' and timm's defaults, the weights random.
GPT-2 large (3.35 GB) is over protobuf's 2 GB, so it is written as one .onnx file and one external
data file beside it, as optimum does. Each model is exported in its own subprocess so that the
exporter's memory is given back before the next one.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _real_models as real_models  # noqa: E402

CACHE = os.path.join(real_models.CACHE, "scale")
SEQ = 32  # the sequence length every measurement runs at
EXPORT_SEQ = 8  # traced at another length than it runs at, so no length is baked in
VERSION = "1"  # bump when the export changes: cached files carry it in their names


@dataclass(frozen=True)
class ScaleCase:
    """One model: how to build it, what its ONNX export is called, and what the benchmarks differentiate.

    `deep` names the torch module whose weight is differentiated: in the first block, so the gradient
    flows back through the whole network. `node` is the substring of the ONNX node name (the
    torchscript exporter names nodes after module paths) whose weight input is that weight; `last`
    is the same for a weight of the last block (the issue's `onnxgrad graph --view combined`).
    """

    name: str
    inputs: tuple[str, ...]
    output: str
    deep: str
    node: str
    last: str
    external: bool = False

    @property
    def folder(self) -> str:
        return os.path.join(CACHE, f"{self.name}-v{VERSION}")

    @property
    def path(self) -> str:
        return os.path.join(self.folder, f"{self.name}.onnx")

    @property
    def data_file(self) -> str | None:
        return f"{self.name}.onnx.data" if self.external else None

    def built(self) -> bool:
        return os.path.exists(self.path) and (not self.external or os.path.exists(os.path.join(self.folder, self.data_file)))

    def bytes(self) -> int:
        """The model's bytes on disk: the .onnx file plus its external data."""
        total = os.path.getsize(self.path)
        if self.external:
            total += os.path.getsize(os.path.join(self.folder, self.data_file))
        return total


CASES = (
    ScaleCase("resnet50", ("x",), "y", "layer1.0.conv2", "/layer1/layer1.0/conv2/", "/layer4/layer4.2/conv2/"),
    ScaleCase("bert_base", ("input_ids", "attention_mask"), "last_hidden_state",
              "encoder.layer.0.intermediate.dense", "/encoder/layer.0/intermediate/dense/",
              "/encoder/layer.11/intermediate/dense/"),
    ScaleCase("gpt2", ("input_ids", "attention_mask"), "logits", "transformer.h.0.mlp.c_fc", "/transformer/h.0/mlp/c_fc/",
              "/transformer/h.11/mlp/c_fc/"),
    ScaleCase("gpt2_large", ("input_ids", "attention_mask"), "logits", "transformer.h.0.mlp.c_fc",
              "/transformer/h.0/mlp/c_fc/", "/transformer/h.35/mlp/c_fc/", external=True),
)
BY_NAME = {c.name: c for c in CASES}


def case(name: str) -> ScaleCase:
    try:
        return BY_NAME[name]
    except KeyError:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(BY_NAME)}") from None


def import_library(case: ScaleCase):
    """timm or transformers, whichever builds `case` (so a measurement can take its baseline after it)."""
    real_models.stub_torchvision()  # transformers imports torchvision too
    import importlib

    return importlib.import_module("timm" if case.name == "resnet50" else "transformers")


def module(case: ScaleCase, seed: int = 0):
    """The torch module (eval mode, every parameter perturbed) whose forward takes `case.inputs` in order."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    library = import_library(case)
    if case.name == "resnet50":
        inner = library.create_model("resnet50", pretrained=False)
    else:
        tf = library
        if case.name == "bert_base":
            inner = tf.BertModel(tf.BertConfig(attn_implementation="eager"))
        else:
            config = tf.GPT2Config(attn_implementation="eager") if case.name == "gpt2" else \
                tf.GPT2Config(n_embd=1280, n_layer=36, n_head=20, attn_implementation="eager")
            inner = tf.GPT2LMHeadModel(config)
        inner.config.use_cache = False

    class Exported(nn.Module):
        """The model as a function of exactly the ONNX inputs to exactly the ONNX output."""

        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, *args):
            if case.name == "resnet50":
                return self.model(args[0])
            out = self.model(input_ids=args[0], attention_mask=args[1])
            return getattr(out, case.output)

    wrapped = Exported().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # distinct values: exporters merge equal initializers and fold identity BatchNorms
        for p in wrapped.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        for name, b in wrapped.named_buffers():
            if b.is_floating_point() and "running_var" in name:
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif b.is_floating_point() and "running_mean" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return wrapped


def deep_parameter(case: ScaleCase, wrapped):
    """The torch parameter that `deep_weight` names in the export (the same module's weight)."""
    return wrapped.get_submodule("model." + case.deep).weight


def example(case: ScaleCase, seq: int = SEQ, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at `seq` tokens (int64 ids and an all-ones mask) or one 224x224 image."""
    rng = np.random.default_rng(seed)
    if case.name == "resnet50":
        return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    vocab = 30522 if case.name == "bert_base" else 50257
    return {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), np.int64)}


def deep_weight(graph, case: ScaleCase, node_name: str | None = None) -> str:
    """The initializer of the export that `case.deep`'s weight became: the weight input of the node
    named after that module (a Conv's, or the MatMul/Gemm's initializer operand). `node_name`: another
    module's path in node names (`case.last`)."""
    wanted = node_name or case.node
    for node in graph.nodes:
        if wanted in node.name and node.op_type in ("Conv", "MatMul", "Gemm"):
            for t in node.input:
                if t in graph.initializers and len(graph.initializers[t].dims) >= 2:
                    return t
    raise LookupError(f"{case.name}: no Conv/MatMul/Gemm node under {wanted!r} reads a weight")


def export(case: ScaleCase) -> str:
    """Export `case` to its cache folder (one external data file for the >2 GB one); returns the path."""
    import torch

    wrapped = module(case)
    ex = example(case, seq=EXPORT_SEQ, batch=2)
    args = tuple(torch.from_numpy(ex[n]) for n in case.inputs)
    axes = {n: {0: "batch"} if case.name == "resnet50" else {0: "batch", 1: "sequence"} for n in case.inputs}
    axes[case.output] = {0: "batch"} if case.name == "resnet50" else {0: "batch", 1: "sequence"}
    os.makedirs(case.folder, exist_ok=True)
    staging = os.path.join(case.folder, "staging")
    os.makedirs(staging, exist_ok=True)
    target = os.path.join(staging, os.path.basename(case.path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, args, target, dynamo=False, opset_version=18, input_names=list(case.inputs),
                          output_names=[case.output], dynamic_axes=axes)
    del wrapped
    if case.external:
        _one_data_file(target, case.path, case.data_file)
    else:
        os.replace(target, case.path)
    for leftover in os.listdir(staging):
        os.remove(os.path.join(staging, leftover))
    os.rmdir(staging)
    return case.path


def _one_data_file(source: str, dest: str, data_name: str) -> None:
    """Rewrite an export whose weights sit in one file per tensor (torch's >2 GB layout) as one .onnx
    and one data file, streaming each tensor: never more than one tensor in memory."""
    import onnx
    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(source, load_external_data=False)
    base = os.path.dirname(source)
    data_path = os.path.join(os.path.dirname(dest), data_name)
    with open(data_path + ".tmp", "wb") as out:
        for tensor in model.graph.initializer:
            if uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                with open(os.path.join(base, info.location), "rb") as fh:
                    fh.seek(info.offset or 0)
                    data = fh.read(info.length) if info.length is not None else fh.read()
            elif tensor.HasField("raw_data") and len(tensor.raw_data) >= 1024:
                data = tensor.raw_data
            else:
                continue
            out.write(b"\0" * (-out.tell() % 64))  # aligned, as onnx writes it: mmap views need no copy
            offset = out.tell()
            out.write(data)
            tensor.ClearField("raw_data")
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", offset), ("length", len(data))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            tensor.data_location = TensorProto.EXTERNAL
    os.replace(data_path + ".tmp", data_path)
    onnx.save(model, dest + ".tmp")
    os.replace(dest + ".tmp", dest)


def ensure(names=None, quiet: bool = False) -> list[ScaleCase]:
    """Build whatever of `names` (default: all) is not cached, each in a fresh process."""
    todo = [case(n) for n in names] if names else list(CASES)
    for c in todo:
        if c.built():
            continue
        if not quiet:
            print(f"exporting {c.name} to {c.folder} (once; cached) ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), "_export", c.name], check=True)
    return todo


def main(argv: list[str]) -> int:
    if argv[:1] == ["_export"]:
        export(case(argv[1]))
        return 0
    if argv[:1] == ["build"]:
        ensure(argv[1:] or None)
        argv = ["list"]
    if argv[:1] == ["list"]:
        for c in CASES:
            print(f"{c.name:11s} {c.bytes() / 1e9:6.2f} GB  {c.path}" if c.built() else f"{c.name:11s} (not built)")
        return 0
    print(__doc__.strip().splitlines()[3], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
