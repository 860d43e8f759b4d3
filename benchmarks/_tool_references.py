"""The torch-autograd oracle for a built tool case: run inside the case's tool venv,

    python benchmarks/_tool_references.py CASE FOLDER

it rebuilds the case's torch module as `_tool_builders` does (same seeds, configs and `perturb`),
maps the ONNX y and xs of FOLDER/case.json onto it, and writes FOLDER/reference.npz: "dy" (a
seeded cotangent of y's shape), "y" (float64) and "grad:<x>" = dy·∂y/∂x by float64 autograd.

The module is first proved to be the exported function: its float32 forward on feeds.npz must
match onnxruntime's y to REL_TOL (relative to y's largest magnitude), else nothing is written.
The model files are only read, never rewritten.

The float64 pass runs under `Float64Islands`: the modules cast to float32 on purpose whatever
their dtype (HF's RMSNorm and T5LayerNorm variance, the rotary angles, diffusers' timesteps), which
would round the reference to float32 at every norm (~1e-7 from the float64 graph); there those
casts keep float64. Constants made in float32 stay float32, as the exporters wrote them; what is
left is the graph's own float32 constants: genai's cos/sin caches (~2e-8), the erf GELU's 1/sqrt(2)
(~3e-9), and the dynamo UNet's timestep frequencies, folded one ulp away from torch's float32 ones
(sin(500 f) moves ~1e-5 per ulp: ~4e-7; with the graph's frequencies torch agrees to ~4e-9).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _tool_builders as tb  # noqa: E402

REL_TOL = 1e-4
DY_SEED = 33

# A case's forward: (module, values) -> y, where values maps every feed and every x to a tensor
# (floats in the module's dtype, xs as autograd leaves in the float64 pass).
Forward = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


@dataclass
class Reference:
    model: torch.nn.Module
    forward: Forward
    after_cast: Callable[[torch.nn.Module], None] = lambda model: None  # weights a dtype cast would round


def _cache(values: dict[str, torch.Tensor], layers: int, kinds=("",)):
    """transformers' DynamicCache from the fed past tensors, one per `kinds` (decoder/encoder)."""
    from transformers import DynamicCache

    return [DynamicCache(ddp_cache_data=[(values[f"past_key_values.{i}{k}.key"], values[f"past_key_values.{i}{k}.value"])
                                         for i in range(layers)]) for k in kinds]


def _seq2seq_cache(values, layers):
    """Self-attention past and cross-attention past (the merged decoders' encoder-side cache);
    EncoderDecoderCache marks a filled cross cache as updated, so the encoder states are not reread."""
    from transformers import EncoderDecoderCache

    return EncoderDecoderCache(*_cache(values, layers, (".decoder", ".encoder")))


# --- the cases: the module and its forward ------------------------------------------------------
def yolo11n(folder: Path):
    """The model exactly as ultralytics' exporter prepares it (BatchNorm fused, Detect in export
    mode): the export is run with its ONNX writer replaced by a hook that keeps the model."""
    from ultralytics.engine.exporter import Exporter

    kept = {}

    def keep(self, prefix=None):
        kept["model"] = self.model

    original, Exporter.export_onnx = Exporter.export_onnx, keep
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            tb.yolo_model().export(format="onnx", imgsz=320)
        finally:
            os.chdir(cwd)
            Exporter.export_onnx = original

    def forward(model, v):
        out = model(v["images"])
        return out[0] if isinstance(out, (tuple, list)) else out
    return Reference(kept["model"], forward)


def _unet(folder: Path):
    step, _, _ = tb.unet_step()
    return Reference(step, lambda m, v: m(v["sample"], v["timestep"], v["encoder_hidden_states"]))


def _llama_forward(positions_fed: bool) -> Forward:
    def forward(model, v):
        embeds = v["embeds"]
        past = tb.PAST
        if positions_fed:
            positions = v["position_ids"]
        else:  # genai: GroupQueryAttention places the new tokens after the past
            positions = torch.arange(past, past + embeds.shape[1])[None].expand(embeds.shape[0], -1)
        cache = _cache(v, model.config.num_hidden_layers)[0]
        return model(inputs_embeds=embeds, attention_mask=v["attention_mask"], position_ids=positions,
                     past_key_values=cache, use_cache=True).logits
    return forward


def llama_past_optimum(folder: Path):
    return Reference(tb.tiny_llama(), _llama_forward(positions_fed=True))


def genai_llama_fp32(folder: Path):
    return Reference(tb.tiny_llama(), _llama_forward(positions_fed=False))


def genai_llama_int4(folder: Path):
    """The Llama with each quantized Linear's weight the dequantized MatMulNBits weight of the file
    (set again after every cast: a float64 product of a float32 scale and a nibble is exact, its
    float32 rounding is not)."""
    weights = dequantized_weights(folder / "model.onnx")

    def load(model):
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, w in weights.items():
                layer, _, proj = name.rpartition(".")
                if proj == "qkv_proj":  # genai packs q, k and v into one MatMulNBits: its columns in that order
                    attn = layer.replace(".attn", ".self_attn")
                    sizes = [params[f"{attn}.{p}_proj.weight"].shape[0] for p in "qkv"]
                    for p, part in zip("qkv", torch.split(w, sizes, dim=1)):
                        params[f"{attn}.{p}_proj.weight"].copy_(part.T)
                else:
                    params[f"{name.replace('.attn.', '.self_attn.')}.weight"].copy_(w.T)
    return Reference(tb.tiny_llama(), _llama_forward(positions_fed=False), load)


def dequantized_weights(path: Path) -> dict[str, torch.Tensor]:
    """Module path ('model.layers.0.attn.qkv_proj', 'lm_head') -> the float64 (K, N) weight each
    4-bit MatMulNBits holds: (q - zero point) * scale per block of `block_size` rows along K, low
    nibble first; zero point 8 when none is given (the builder's symmetric quantization)."""
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = {}
    for node in m.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        if a["bits"] != 4 or len(node.input) > 4 and node.input[4] or len(node.input) > 5 and node.input[5]:
            raise RuntimeError(f"{node.name}: only 4 bits, no g_idx and no bias are mapped")
        k, n, block = a["K"], a["N"], a["block_size"]
        packed = inits[node.input[1]].reshape(n, -1)
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)[:, :k].astype(np.float64)
        blocks = -(-k // block)
        scales = inits[node.input[2]].astype(np.float64).reshape(n, -1)[:, :blocks]
        if len(node.input) > 3 and node.input[3]:
            zp = inits[node.input[3]].reshape(n, -1)
            zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks].astype(np.float64)
        else:
            zp = np.full_like(scales, 8.0)
        w = (q - np.repeat(zp, block, axis=1)[:, :k]) * np.repeat(scales, block, axis=1)[:, :k]
        name = node.name.removeprefix("/").removesuffix("/MatMul_Q4").replace("/", ".")
        out[name] = torch.from_numpy(w.T.copy())  # (K, N): y = x @ w
    return out


def t5_merged(folder: Path):
    def forward(model, v):
        cache = _seq2seq_cache(v, model.config.num_decoder_layers)
        return model(encoder_outputs=(v["encoder_hidden_states"],), attention_mask=v["encoder_attention_mask"],
                     decoder_input_ids=v["input_ids"], past_key_values=cache, use_cache=True).logits
    return Reference(tb.tiny_t5(), forward)


def whisper_merged(folder: Path):
    def forward(model, v):
        cache = _seq2seq_cache(v, model.config.decoder_layers)
        return model(encoder_outputs=(v["encoder_hidden_states"],), decoder_input_ids=v["input_ids"],
                     past_key_values=cache, use_cache=True).logits
    return Reference(tb.tiny_whisper(), forward)


def whisper_encoder(folder: Path):
    return Reference(tb.tiny_whisper(), lambda m, v: m.model.encoder(v["input_features"]).last_hidden_state)


CASES = {"yolo11n": yolo11n, "unet_torchscript": _unet, "unet_dynamo": _unet,
         "llama_past_optimum": llama_past_optimum, "t5_merged": t5_merged, "whisper_encoder": whisper_encoder,
         "whisper_merged": whisper_merged, "genai_llama_fp32": genai_llama_fp32, "genai_llama_int4": genai_llama_int4}


# --- the oracle ---------------------------------------------------------------------------------
def fingerprint(folder: Path) -> str:
    """sha256 of case.json, feeds.npz and the model with its external data: a reference.npz
    carries it, so one left from an earlier build of the case is recognised."""
    model = json.loads((folder / "case.json").read_text())["model"]
    h = hashlib.sha256()
    for f in ["case.json", "feeds.npz"] + sorted(f.name for f in folder.iterdir() if f.name.startswith(model)):
        h.update(f.encode() + b"\0" + (folder / f).read_bytes())
    return h.hexdigest()


class Float64Islands(torch.overrides.TorchFunctionMode):
    """A cast to float32 (`.float()`, `.to(torch.float32)`, `.type(...)`) of a tensor that is not
    float32 gives float64: float64 stays float64, and integers (positions, timesteps) meet it in
    float64. A float32 tensor (a constant the module makes in float32) is cast as written."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.float, torch.Tensor.to, torch.Tensor.type) and args and \
                isinstance(args[0], torch.Tensor) and args[0].dtype != torch.float32:
            if func is torch.Tensor.float:
                return args[0].to(torch.float64)
            keep = (lambda a: torch.float64 if a is torch.float32 or a in ("torch.FloatTensor", "torch.float32") else a)
            args = (args[0],) + tuple(keep(a) for a in args[1:])
            kwargs = {k: keep(a) for k, a in kwargs.items()}
        return func(*args, **kwargs)


def values(model, feeds: dict[str, np.ndarray], xs: list[str], dtype: torch.dtype, leaves: bool):
    """Every feed as a tensor (floats in `dtype`) and every x, as a leaf when `leaves`. An x that is
    not fed is the LLM's token embedding output: the module's embedding of the fed input_ids, also
    known to the forward as "embeds"."""
    v = {}
    for k, a in feeds.items():
        t = torch.from_numpy(np.ascontiguousarray(a))
        v[k] = t.to(dtype) if t.is_floating_point() else t
    for x in xs:
        if x not in v:
            v[x] = v["embeds"] = model.get_input_embeddings()(v["input_ids"]).detach().to(dtype)
        if leaves:
            v[x] = v[x].clone().requires_grad_()
            if x not in feeds:
                v["embeds"] = v[x]
    return v


def onnxruntime_y(path: Path, y: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's y; MatMulNBits at accuracy_level 0 (float activations, the dequantized-weight
    function the reference computes) instead of the int8 activations of level 4."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run([y], {k: v for k, v in feeds.items() if k in names})[0]


def reference(name: str, folder: Path) -> dict[str, np.ndarray]:
    """reference.npz's arrays, after the float32 forward is checked against onnxruntime."""
    case = json.loads((folder / "case.json").read_text())
    with np.load(folder / "feeds.npz") as npz:
        feeds = {k: npz[k] for k in npz.files}
    ref = CASES[name](folder)
    want = onnxruntime_y(folder / case["model"], case["y"], feeds)
    model = ref.model.float().eval()
    ref.after_cast(model)
    with torch.no_grad():
        got = ref.forward(model, values(model, feeds, case["xs"], torch.float32, leaves=False)).numpy()
    scale = float(np.abs(want).max())
    rel = float(np.abs(got - want).max()) / scale if got.shape == want.shape else float("inf")
    print(f"{name}: float32 torch vs onnxruntime {case['y']} {want.shape}: max |diff| / max |y| = {rel:.3g}")
    if not rel <= REL_TOL:
        raise SystemExit(f"{name}: the torch module is not the exported function ({rel:.3g} > {REL_TOL}, "
                         f"shapes {got.shape} vs {want.shape}); reference.npz not written")
    model = model.double()
    ref.after_cast(model)
    v = values(model, feeds, case["xs"], torch.float64, leaves=True)
    with Float64Islands():
        y = ref.forward(model, v)
    dy = torch.from_numpy(np.random.default_rng(DY_SEED).standard_normal(tuple(y.shape)))
    grads = torch.autograd.grad(y, [v[x] for x in case["xs"]], dy, allow_unused=True)
    rel64 = float(np.abs(y.detach().numpy() - want).max()) / scale
    print(f"{name}: float64 torch vs onnxruntime: {rel64:.3g}")
    out = {"y": y.detach().numpy(), "dy": dy.numpy(), "fingerprint": np.array(fingerprint(folder))}
    for x, g in zip(case["xs"], grads):
        out[f"grad:{x}"] = (torch.zeros_like(v[x]) if g is None else g).detach().numpy()
    return out


if __name__ == "__main__":
    name, folder = sys.argv[1], Path(sys.argv[2])
    from _real_models import stub_torchvision

    stub_torchvision()  # transformers and ultralytics import torchvision, whose compiled ops do not load here
    arrays = reference(name, folder)
    # Written beside and renamed: a reader never sees half a file.
    np.savez(folder / "reference.tmp.npz", **arrays)
    os.replace(folder / "reference.tmp.npz", folder / "reference.npz")
    print(f"{name}: wrote {folder / 'reference.npz'} ({', '.join(arrays)})")
