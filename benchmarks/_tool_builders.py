"""The builders behind `_tool_exports`: each runs inside its tool's side virtual environment
(`python benchmarks/_tool_builders.py CASE FOLDER`) and writes into FOLDER what the tool writes
(model.onnx, or the tool's own file names, external data, configs), feeds.npz and case.json.

Everything is built offline from small local configs with random, perturbed weights: the hub
is never asked (HF_HUB_OFFLINE is set by the caller), and the noise keeps the exporters from
merging equal initializers or folding BatchNorm into identities.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

SEED = 0
# The decoder step every LLM case is fed: PAST cached tokens and NEW tokens after them.
PAST, NEW = 4, 2
# vocab_size differs from every Linear's out_features: the genai builder takes any nn.Linear with
# out_features == vocab_size for the LM head, and with vocab = intermediate_size it wired the logits
# to layer 0's MLP input, leaving layer 1 dead.
TINY_LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=96, max_position_embeddings=64)


def perturb(module: torch.nn.Module, seed: int = SEED) -> torch.nn.Module:
    """Add noise to every trainable parameter and draw BatchNorm statistics (as _real_models.build),
    so no two initializers are equal and a folded BatchNorm is not an identity. Frozen parameters
    (YOLO's DFL arange kernel) keep their meaning."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad and p.is_floating_point():
                p.add_(0.02 * torch.randn(p.shape, generator=g).to(p.dtype))
        for name, b in module.named_buffers():
            if b.is_floating_point() and name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif b.is_floating_point() and name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return module.eval()


def _reads(node: onnx.NodeProto) -> set[str]:
    """What a node reads, subgraphs (If/Loop/Scan bodies) included: their outer-scope names."""
    names = set(node.input)
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in g.node:
                names |= _reads(inner)
    return names


def needed_inputs(graph: onnx.GraphProto, y: str, xs: list[str]) -> list[str]:
    """The graph inputs y still depends on once xs are cut: the zs. The token ids of an LLM reach
    the logits only through the embedding (an x), so they are not listed; onnxgrad refuses them in
    zs, as the Gradient spec refuses a z that determines an x."""
    producer = {o: n for n in graph.node for o in n.output}
    seen, todo = set(xs), [y]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producer:
            todo.extend(_reads(producer[name]))
    return [i.name for i in graph.input if i.name in seen and i.name not in xs]


def write_case(folder: Path, tool: str, feeds: dict[str, np.ndarray], y: str, xs: list[str], notes: str,
               model: str = "model.onnx") -> Path:
    """feeds.npz (every graph input) and case.json beside the model."""
    graph = onnx.load(str(folder / model), load_external_data=False).graph
    inputs = [i.name for i in graph.input]
    missing = sorted(set(inputs) - set(feeds))
    if missing:
        raise RuntimeError(f"no feed for graph inputs {missing}")
    np.savez(folder / "feeds.npz", **{k: feeds[k] for k in inputs})
    case = {"tool": tool, "model": model, "y": y, "xs": xs, "zs": needed_inputs(graph, y, xs), "notes": notes}
    (folder / "case.json").write_text(json.dumps(case, indent=2) + "\n")
    return folder


def embedding_output(path: Path) -> str:
    """The output of the token embedding: the Gather whose data is an `embed_tokens` initializer.
    Token ids are not differentiable, so this intermediate is where dlogits/dinput starts."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Gather" and node.input[0] in inits and "embed_tokens" in node.input[0]:
            return node.output[0]
    raise RuntimeError(f"{path}: no Gather reads an embed_tokens initializer")


def llm_xs(path: Path, feeds: dict[str, np.ndarray]) -> list[str]:
    """The token embeddings and every past key/value: a layer whose cache does not reach the logits
    shows up as a disconnected x."""
    return [embedding_output(path)] + [n for n in feeds if n.startswith("past_key_values.")]


def feeds_for(path: Path, dims: dict[str, int], vocab: int) -> dict[str, np.ndarray]:
    """A value for every graph input, its symbolic dims sized by `dims`: token ids in [3, vocab)
    (past the special tokens), all-ones masks, position ids continuing PAST cached tokens,
    `use_cache_branch` true (the merged decoders' with-past branch), and N(0, 1) floats, finite and
    O(1) like real hidden states and cached keys/values."""
    rng = np.random.default_rng(SEED)
    feeds: dict[str, np.ndarray] = {}
    for inp in onnx.load(str(path), load_external_data=False).graph.input:
        t = inp.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim)
        if inp.name == "position_ids":
            feeds[inp.name] = np.broadcast_to(np.arange(PAST, PAST + shape[-1], dtype=np.int64), shape).copy()
        elif "mask" in inp.name:
            feeds[inp.name] = np.ones(shape, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        elif t.elem_type == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(3, vocab, shape, dtype=np.int64)
        elif t.elem_type == onnx.TensorProto.BOOL:
            feeds[inp.name] = np.ones(shape, bool)
        elif t.elem_type == onnx.TensorProto.FLOAT:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            raise RuntimeError(f"{path}: no feed rule for input {inp.name!r} of type {t.elem_type}")
    return feeds


def llm_dims(batch: int) -> dict[str, int]:
    """The symbolic dims of a decoder step after PAST tokens, as optimum and the genai builder name them."""
    head_dim = TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"]
    return {"batch_size": batch, "sequence_length": NEW, "past_sequence_length": PAST, "kv_cache_dim": head_dim,
            "total_sequence_length": PAST + NEW, "past_sequence_length + sequence_length": PAST + NEW}


def save_tiny_llama(folder: Path) -> None:
    """A random LlamaForCausalLM and a word-level tokenizer (the exporters load one; none can be
    downloaded), saved with save_pretrained as a hub checkout would be."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    tiny_llama().save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, TINY_LLAMA["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                               eos_token="</s>").save_pretrained(folder)


# --- the torch modules (shared with _tool_references, which rebuilds them as the oracle) ----------
def tiny_llama():
    import transformers as tf

    torch.manual_seed(SEED)
    return perturb(tf.LlamaForCausalLM(tf.LlamaConfig(**TINY_LLAMA, bos_token_id=1, eos_token_id=2)))


def tiny_t5():
    import transformers as tf

    torch.manual_seed(SEED)
    return perturb(tf.T5ForConditionalGeneration(tf.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128,
        decoder_start_token_id=0)))


def tiny_whisper():
    import transformers as tf

    torch.manual_seed(SEED)
    # 1500 source positions: optimum's dummy inputs are 3000 mel frames, which the encoder halves.
    return perturb(tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        vocab_size=128, num_mel_bins=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        suppress_tokens=[], begin_suppress_tokens=[])))


def yolo_model(yaml: str = "yolo11n.yaml"):
    """YOLO(yaml), perturbed; call it with the cwd in a scratch folder (exports land there)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _real_models import stub_torchvision

    stub_torchvision()  # ultralytics imports torchvision; the PyPI wheel's compiled ops do not load here
    from ultralytics import YOLO

    torch.manual_seed(SEED)
    yolo = YOLO(yaml)  # the architecture from the yaml shipped in the package
    perturb(yolo.model)
    return yolo


# --- the cases ----------------------------------------------------------------------------------
def yolo_export(yaml: str, imgsz: int) -> Path:
    """The ONNX file ultralytics writes for YOLO(yaml) (in a scratch folder that outlives this call)."""
    tmp = tempfile.mkdtemp()
    cwd = os.getcwd()
    os.chdir(tmp)  # the export lands next to the "weights" (the yaml name), i.e. in the cwd
    try:
        return Path(yolo_model(yaml).export(format="onnx", imgsz=imgsz)).resolve()
    finally:
        os.chdir(cwd)


def yolo11n(folder: Path) -> Path:
    shutil.move(yolo_export("yolo11n.yaml", 320), folder / "model.onnx")
    images = np.random.default_rng(SEED).random((1, 3, 320, 320), dtype=np.float32)
    return write_case(folder, "ultralytics", {"images": images}, "output0", ["images"],
                      "ultralytics YOLO('yolo11n.yaml').export(format='onnx', imgsz=320): torchscript exporter, "
                      "BatchNorm fused into Conv, onnxslim-simplified; output0 is (1, 84, 2100) boxes + class scores")


class UNetStep(torch.nn.Module):
    """The UNet as the Stable Diffusion ONNX exports call it: (sample, timestep, text states) -> noise."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


def unet_step() -> tuple[UNetStep, tuple[torch.Tensor, ...], list[str]]:
    """The perturbed UNet step, the arguments it is exported with, and their input names."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    step = UNetStep(perturb(unet))
    g = torch.Generator().manual_seed(SEED)
    # A float timestep, as diffusers' own ONNX pipelines feed it (it goes through the sinusoidal projection).
    args = (torch.randn(1, 4, 16, 16, generator=g), torch.tensor([500.0]), torch.randn(1, 8, 32, generator=g))
    return step, args, ["sample", "timestep", "encoder_hidden_states"]


def _unet(folder: Path, dynamo: bool) -> Path:
    step, args, names = unet_step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # dynamo writes weights over its size threshold to model.onnx.data beside the model: kept, as users get it.
        torch.onnx.export(step, args, str(folder / "model.onnx"), dynamo=dynamo, opset_version=18 if dynamo else 17,
                          input_names=names, output_names=["out_sample"])
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    exporter = "dynamo=True, opset 18" if dynamo else "dynamo=False, opset 17"
    return write_case(folder, "diffusers", feeds, "out_sample", ["sample", "encoder_hidden_states"],
                      f"diffusers UNet2DConditionModel (tiny: 2 blocks, one cross-attention block each way) by "
                      f"torch.onnx.export {exporter}")


def unet_torchscript(folder: Path) -> Path:
    return _unet(folder, dynamo=False)


def unet_dynamo(folder: Path) -> Path:
    return _unet(folder, dynamo=True)


def _optimum(hf_dir: Path, folder: Path, task: str) -> None:
    from optimum.exporters.onnx import main_export

    main_export(str(hf_dir), output=str(folder), task=task, device="cpu")


def llama_past_optimum(folder: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_llama(Path(tmp))
        _optimum(Path(tmp), folder, "text-generation-with-past")
    path = folder / "model.onnx"
    feeds = feeds_for(path, llm_dims(batch=2), TINY_LLAMA["vocab_size"])
    return write_case(folder, "optimum-onnx", feeds, "logits", llm_xs(path, feeds),
                      f"optimum-onnx main_export task text-generation-with-past of a tiny LlamaForCausalLM; one step "
                      f"of {NEW} tokens after {PAST} cached ones (batch 2)")


def t5_merged(folder: Path) -> Path:
    model = tiny_t5()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        _optimum(Path(tmp), folder, "text2text-generation-with-past")
    path, enc = folder / "decoder_model_merged.onnx", 8
    feeds = feeds_for(path, {"batch_size": 2, "decoder_sequence_length": NEW, "past_decoder_sequence_length": PAST,
                             "encoder_sequence_length": enc}, 128)
    xs = [n for n in feeds if n.startswith("past_key_values.")]
    return write_case(folder, "optimum-onnx", feeds, "logits", xs,
                      "optimum-onnx text2text-generation-with-past of a tiny T5: the merged decoder, one If on "
                      "use_cache_branch (fed true: the with-past branch) whose branches share the outer initializers; "
                      f"{NEW} decoder tokens after {PAST} cached, encoder length {enc}. encoder_model.onnx, "
                      "decoder_model.onnx and decoder_with_past_model.onnx are beside it",
                      model=path.name)


def _whisper(folder: Path, merged: bool) -> Path:
    model = tiny_whisper()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        _optimum(Path(tmp), folder, "automatic-speech-recognition-with-past")
    dims = {"batch_size": 1, "decoder_sequence_length": NEW, "past_decoder_sequence_length": PAST,
            "encoder_sequence_length": 1500}
    common = "optimum-onnx automatic-speech-recognition-with-past of a tiny Whisper (16 mel bins, 3000 frames): "
    if not merged:
        path = folder / "encoder_model.onnx"
        return write_case(folder, "optimum-onnx", feeds_for(path, dims, 128), "last_hidden_state", ["input_features"],
                          common + "the encoder (Conv1d + GELU front, one layer); the decoders are beside it",
                          model=path.name)
    path = folder / "decoder_model_merged.onnx"
    feeds = feeds_for(path, dims, 128)
    xs = [n for n in feeds if n.startswith("past_key_values.")]
    return write_case(folder, "optimum-onnx", feeds, "logits", xs,
                      common + f"the merged decoder (If on use_cache_branch, fed true), {NEW} tokens after {PAST} "
                      "cached; encoder_hidden_states is read only by the no-past branch", model=path.name)


def whisper_encoder(folder: Path) -> Path:
    return _whisper(folder, merged=False)


def whisper_merged(folder: Path) -> Path:
    return _whisper(folder, merged=True)


# The genai builder imports transformers, which imports torchvision: stubbed first, as in this process.
GENAI_BUILDER = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); from _real_models import stub_torchvision; "
                 "stub_torchvision(); runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")


def run_genai_builder(hf_dir: Path, folder: Path, precision: str, cache: Path) -> None:
    cmd = [sys.executable, "-c", GENAI_BUILDER, str(Path(__file__).parent), "-i", str(hf_dir), "-o", str(folder),
           "-p", precision, "-e", "cpu", "-c", str(cache)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(done.stdout + done.stderr)  # into build.log
    if done.returncode:
        raise RuntimeError(f"model builder failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def _genai(folder: Path, precision: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny_llama(Path(tmp) / "hf")  # beside the builder's cache folder
        run_genai_builder(Path(tmp) / "hf", folder, precision, Path(tmp) / "cache")
    path = folder / "model.onnx"
    # batch 1: onnxruntime's GroupQueryAttention refuses a batch > 1 when new tokens follow a past.
    feeds = feeds_for(path, llm_dims(batch=1), TINY_LLAMA["vocab_size"])
    int4 = ("; MatMulNBits with accuracy_level 4: onnxruntime's kernel quantizes the activations to int8, so its "
            "logits differ from a float computation by ~5e-3") if precision == "int4" else ""
    return write_case(folder, "onnxruntime-genai", feeds, "logits", llm_xs(path, feeds),
                      f"onnxruntime-genai model builder -p {precision} -e cpu of a tiny Llama: GroupQueryAttention "
                      "with rotary inside, SkipSimplifiedLayerNormalization; the folder is a genai model "
                      f"(genai_config.json, tokenizer); no position_ids (GQA derives them from the mask){int4}")


def genai_llama_fp32(folder: Path) -> Path:
    return _genai(folder, "fp32")


def genai_llama_int4(folder: Path) -> Path:
    return _genai(folder, "int4")


BUILDERS = {f.__name__: f for f in (yolo11n, unet_torchscript, unet_dynamo, llama_past_optimum, t5_merged,
                                     whisper_encoder, whisper_merged, genai_llama_fp32, genai_llama_int4)}

if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    sys.path.insert(0, str(Path(__file__).parent))
    from _real_models import stub_torchvision

    stub_torchvision()  # transformers imports torchvision too (installed system-wide since), ops unloadable
    out.mkdir(parents=True, exist_ok=True)
    from _tool_builders_more import MORE  # more architectures per tool, built the same way

    BUILDERS.update(MORE)
    BUILDERS[name](out)
