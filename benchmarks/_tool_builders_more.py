"""More exports per tool, beside `_tool_builders`' cases: other architectures through the same tools, so that
what works on the first cases is seen to work on their neighbours (GPT-2's fused QKV and Conv1D, Qwen2's
biased QKV, BART's merged decoder, Gemma's scaled embedding and GELU MLP through the genai builder, its int4
Qwen2, YOLOv8's segmentation head). Run inside the tool's venv like the builders."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from _tool_builders import SEED, TINY_LLAMA, _optimum, feeds_for, llm_dims, perturb, run_genai_builder, write_case, yolo_export

VOCAB = TINY_LLAMA["vocab_size"]
DECODER = {k: TINY_LLAMA[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size", "vocab_size",
                                       "max_position_embeddings")}


def _save(model, folder: Path) -> None:
    """The model and a word-level tokenizer over its vocabulary, as a hub checkout would be."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, model.config.vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                               eos_token="</s>").save_pretrained(folder)


def token_embedding(path: Path) -> str:
    """The output of the Gather that reads the token table (an initializer, or genai's transposed tied table)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Gather" and node.input[1] == "input_ids" or (
                node.op_type == "Gather" and node.input[0] in inits and "wte" in node.input[0]):
            return node.output[0]
    raise RuntimeError(f"{path}: no Gather reads the token ids")


def _decoder_case(folder: Path, tool: str, batch: int, notes: str) -> Path:
    path = folder / "model.onnx"
    feeds = feeds_for(path, llm_dims(batch), VOCAB)
    xs = [token_embedding(path)] + [n for n in feeds if n.startswith("past_key_values.")]
    return write_case(folder, tool, feeds, "logits", xs, notes)


def _optimum_decoder(folder: Path, model, notes: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        _save(model, Path(tmp))
        _optimum(Path(tmp), folder, "text-generation-with-past")
    return _decoder_case(folder, "optimum-onnx", 2, f"optimum-onnx text-generation-with-past of a tiny {notes}; one "
                         "step of 2 tokens after 4 cached ones (batch 2)")


def gpt2_optimum(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(SEED)
    config = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)
    return _optimum_decoder(folder, perturb(tf.GPT2LMHeadModel(config)), "GPT-2 (fused QKV Conv1D, learned positions)")


def qwen2_optimum(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(SEED)
    return _optimum_decoder(folder, perturb(tf.Qwen2ForCausalLM(tf.Qwen2Config(**DECODER))),
                            "Qwen2 (biased QKV, grouped KV heads)")


def bart_merged(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(SEED)
    model = perturb(tf.BartForConditionalGeneration(tf.BartConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64)))
    with tempfile.TemporaryDirectory() as tmp:
        _save(model, Path(tmp))
        _optimum(Path(tmp), folder, "text2text-generation-with-past")
    path = folder / "decoder_model_merged.onnx"
    feeds = feeds_for(path, {"batch_size": 2, "decoder_sequence_length": 2, "past_decoder_sequence_length": 4,
                             "encoder_sequence_length": 8}, VOCAB)
    xs = [n for n in feeds if n.startswith("past_key_values.")]
    return write_case(folder, "optimum-onnx", feeds, "logits", xs, "optimum-onnx text2text-generation-with-past of a "
                      "tiny BART: the merged decoder (If on use_cache_branch, fed true)", model=path.name)


def _genai_arch(folder: Path, model, precision: str, notes: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        _save(model, Path(tmp) / "hf")
        run_genai_builder(Path(tmp) / "hf", folder, precision, Path(tmp) / "cache")
    return _decoder_case(folder, "onnxruntime-genai", 1, notes)


def genai_gemma_fp32(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(SEED)
    model = perturb(tf.GemmaForCausalLM(tf.GemmaConfig(**DECODER, head_dim=16, pad_token_id=0, bos_token_id=1,
                                                       eos_token_id=2)))
    return _genai_arch(folder, model, "fp32", "onnxruntime-genai model builder -p fp32 of a tiny Gemma (scaled "
                       "embedding, GELU MLP, tied head read through a Transpose)")


def genai_qwen2_int4(folder: Path) -> Path:
    import transformers as tf

    torch.manual_seed(SEED)
    model = perturb(tf.Qwen2ForCausalLM(tf.Qwen2Config(**DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2)))
    return _genai_arch(folder, model, "int4", "onnxruntime-genai model builder -p int4 of a tiny Qwen2 (biased QKV "
                       "beside MatMulNBits; accuracy_level 4: onnxruntime's int8 activations differ by ~5e-3)")


def yolov8n_seg(folder: Path) -> Path:
    exported = yolo_export("yolov8n-seg.yaml", imgsz=256)
    shutil.move(exported, folder / "model.onnx")
    images = np.random.default_rng(SEED).random((1, 3, 256, 256), dtype=np.float32)
    return write_case(folder, "ultralytics", {"images": images}, "output0", ["images"],
                      "ultralytics YOLO('yolov8n-seg.yaml').export(format='onnx', imgsz=256): boxes, classes and "
                      "mask coefficients (output0) beside the prototype masks (output1)")


MORE = {f.__name__: f for f in (gpt2_optimum, qwen2_optimum, bart_merged, genai_gemma_fp32, genai_qwen2_int4,
                                 yolov8n_seg)}
