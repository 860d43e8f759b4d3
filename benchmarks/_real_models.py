"""Real architectures from timm and transformers (small configs, random weights), each exported
by both torch exporters, with what is needed to compare onnxgrad against torch on them.

timm and transformers are optional (never project dependencies: they would pull a CUDA torch
in CI); `available()` says whether they import. The torchvision installed beside torch may not
load its compiled ops; `stub_torchvision()` keeps its fake-kernel registrations from failing so
that timm imports (no torchvision op is used by these models).
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

EXPORTERS = ("torchscript", "dynamo")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "onnxgrad-bench")


def stub_torchvision() -> None:
    """Let `import torchvision` succeed without its compiled ops (register_fake for torchvision:: is a no-op)."""
    import torch.library

    original = torch.library.register_fake
    if getattr(original, "_onnxgrad_stub", False):
        return

    def register_fake(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            return args[0] if args and callable(args[0]) else (lambda fn: fn)
        return original(op, *args, **kwargs)

    register_fake._onnxgrad_stub = True
    torch.library.register_fake = register_fake


def available() -> bool:
    stub_torchvision()
    try:
        import timm  # noqa: F401
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


class Hidden(nn.Module):
    """A transformers model as a function of token ids to its last hidden state."""

    def __init__(self, model):
        super().__init__()
        model.config.use_cache = False  # no key/value cache outputs: one tensor out
        self.model = model

    def forward(self, ids):
        # An explicit mask keeps transformers off its packed-sequence detection (torch.diff, no ONNX export).
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


class ImageHidden(nn.Module):
    """A transformers vision model as a function of pixels to its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels):
        return self.model(pixel_values=pixels).last_hidden_state


@dataclass(frozen=True)
class RealCase:
    name: str
    make: Callable[[], nn.Module]
    example: Callable[[], torch.Tensor]


def _timm(name: str, **kw) -> Callable[[], nn.Module]:
    def make():
        stub_torchvision()
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw)

    return make


def _hf(kind: str) -> Callable[[], nn.Module]:
    def make():
        import transformers as tf

        small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     vocab_size=128, max_position_embeddings=64)
        if kind == "vit":
            return ImageHidden(tf.ViTModel(tf.ViTConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8, attn_implementation="eager"), add_pooling_layer=False))
        if kind == "t5":
            model = tf.T5EncoderModel(tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                                  vocab_size=128, attn_implementation="eager"))
        elif kind == "bert":
            model = tf.BertModel(tf.BertConfig(**small, attn_implementation="eager"), add_pooling_layer=False)
        elif kind == "gpt2":
            model = tf.GPT2Model(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=128,
                                               n_positions=64, attn_implementation="eager"))
        else:
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2,
                                                       attn_implementation="eager")).model
        return Hidden(model)

    return make


def _ids():
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def _image(size: int):
    return lambda: torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


CASES = (
    RealCase("bert", _hf("bert"), _ids),
    RealCase("gpt2", _hf("gpt2"), _ids),
    RealCase("llama", _hf("llama"), _ids),
    RealCase("vit_tiny", _timm("vit_tiny_patch16_224", img_size=64), _image(64)),
    RealCase("resnet18", _timm("resnet18"), _image(64)),
    RealCase("efficientnet_b0", _timm("efficientnet_b0"), _image(64)),
    RealCase("densenet121", _timm("densenet121"), _image(64)),
)

# The architectures of the lowering survey (issue 19): bench_real's plus five more, each by both exporters.
LOWERING_CASES = CASES + (
    RealCase("mobilenetv3", _timm("mobilenetv3_small_050"), _image(64)),
    RealCase("convnext_atto", _timm("convnext_atto"), _image(64)),
    RealCase("regnetx_002", _timm("regnetx_002"), _image(64)),
    RealCase("t5_encoder", _hf("t5"), _ids),
    RealCase("vit_hf", _hf("vit"), _image(32)),
)


def build(case: RealCase, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The module in eval mode with every parameter and buffer perturbed (distinct values, so the
    exporters merge no initializers and folded BatchNorms are not identities), and its input."""
    torch.manual_seed(seed)
    module = case.make().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        for name, b in module.named_buffers():
            if b.is_floating_point() and "running_var" in name:
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif b.is_floating_point() and "running_mean" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return module, case.example()


def export(module: nn.Module, x: torch.Tensor, exporter: str, opset: int = 18, cache: str | None = CACHE,
           dynamic: bool = False) -> bytes:
    """The ONNX bytes of `module` at `x` by one exporter (cached on disk by name and weights); with
    `dynamic`, the batch axis (and a token sequence's length) symbolic."""
    digest = hashlib.sha1()
    for v in list(module.state_dict().values()) + [x]:
        digest.update(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()[:4096])  # any dtype
    kind = f"{exporter}-dynamic" if dynamic else exporter
    key = f"{type(module).__name__}-{kind}-{opset}-{torch.__version__}-{digest.hexdigest()[:16]}.onnx"
    path = os.path.join(cache or "", key)
    if cache and os.path.exists(path):
        with open(path, "rb") as fh:
            return fh.read()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        axes = ({0: "batch", 1: "seq"} if not x.is_floating_point() else {0: "batch"}) if dynamic else None
        if exporter == "dynamo":
            shapes = ({k: torch.export.Dim.AUTO for k in axes},) if axes else None
            program = torch.onnx.export(module, (x,), dynamo=True, opset_version=opset, input_names=["x"],
                                        output_names=["y"], verbose=False, dynamic_shapes=shapes)
            program.save(buf)
        else:
            torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=opset, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": axes} if axes else None)
    data = buf.getvalue()
    if not cache:
        return data
    os.makedirs(cache, exist_ok=True)
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)
    return data


def match_weights(model, module: nn.Module) -> dict[str, tuple[str, bool]]:
    """ONNX initializer -> (parameter name, transposed) for initializers equal to a parameter by
    value (the exporters rename, transpose MatMul weights and fold BatchNorm into Conv)."""
    consts = model.constants()
    params = dict(module.named_parameters())
    out = {}
    for init, v in consts.items():
        if not v.is_floating_point() or v.numel() < 2:
            continue
        for pname, p in params.items():
            p = p.detach()
            if p.shape == v.shape and torch.equal(p, v):
                out[init] = (pname, False)
                break
            if p.dim() == 2 and p.t().shape == v.shape and torch.equal(p.t(), v):
                out[init] = (pname, True)
                break
    return out
