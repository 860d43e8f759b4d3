"""ONNX files as people bring them: written by the tools around the torch exporter (ultralytics,
diffusers + torch.onnx, optimum-onnx, onnxruntime-genai's model builder) from small random-weight
configs, fully offline.

Each tool lives in its own virtual environment under CACHE/venvs/<tool>, made with
--system-site-packages so that it reuses the system's CPU torch: these tools' requirements would
otherwise pull a multi-GB CUDA torch (or a newer transformers than the next tool wants). A
constraints file pins torch to the installed build, so a resolver that wants another torch fails
instead of downloading one. The builders themselves (`_tool_builders.py`) run in that venv.

A built case is a folder: model.onnx (plus the tool's external data / genai files), feeds.npz
(a value for every graph input, coherent with each other) and case.json (tool, model, y, xs, zs,
notes); `load_case` reads it back. `build_tool_exports.py --references` adds reference.npz, the
torch-autograd oracle of the case (`_tool_references.py`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "onnxgrad-bench"
VENVS = CACHE / "venvs"
DEFAULT_OUT = CACHE / "tools"
BUILDERS = Path(__file__).with_name("_tool_builders.py")


class Unavailable(Exception):
    """A tool that cannot be installed, or a case that cannot be built: skipped with this reason."""


@dataclass(frozen=True)
class Tool:
    name: str
    packages: tuple[str, ...]  # installed with their dependencies
    no_deps: tuple[str, ...] = ()  # installed without: their requirements would pull another torch/torchvision
    env: tuple[tuple[str, str], ...] = ()


def _torchvision_for_torch() -> str:
    """The torchvision release built against this torch (0.N+15 for 2.N): installed --no-deps, its
    compiled ops do not load next to the CPU torch, so the builder stubs them (`stub_torchvision`)."""
    import torch

    minor = int(torch.__version__.split(".")[1])
    return f"torchvision==0.{minor + 15}.*"


TOOLS = {t.name: t for t in (
    Tool("ultralytics",
         ("opencv-python-headless", "pillow", "pyyaml", "matplotlib", "scipy", "psutil", "polars", "requests",
          "onnxslim>=0.1.82", "setuptools>=77"),
         ("ultralytics==8.4.190", "ultralytics-thop>=2.2.3", "TORCHVISION"),
         # No pip runs from inside ultralytics, no network checks, settings kept inside the venv.
         (("YOLO_AUTOINSTALL", "false"), ("YOLO_OFFLINE", "1"), ("YOLO_CONFIG_DIR", "{venv}/ultralytics-config"))),
    Tool("diffusers", ("diffusers==0.42.1", "onnxscript", "setuptools>=77")),
    Tool("optimum", ("optimum-onnx==0.1.0", "setuptools>=77")),
    Tool("genai", ("onnxruntime-genai==0.18.0", "transformers>=5,<6", "onnx-ir", "setuptools>=77")),
)}


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    what: str


CASES = {c.name: c for c in (
    Case("yolo11n", "ultralytics", "YOLO11n detector, imgsz 320"),
    Case("unet_torchscript", "diffusers", "tiny UNet2DConditionModel, torch.onnx dynamo=False opset 17"),
    Case("unet_dynamo", "diffusers", "tiny UNet2DConditionModel, torch.onnx dynamo=True opset 18"),
    Case("llama_past_optimum", "optimum", "tiny Llama, optimum-onnx text-generation-with-past"),
    Case("t5_merged", "optimum", "tiny T5, optimum-onnx merged decoder (If on use_cache_branch)"),
    Case("whisper_encoder", "optimum", "tiny Whisper encoder by optimum-onnx (3000 mel frames)"),
    Case("whisper_merged", "optimum", "tiny Whisper, optimum-onnx merged decoder (If on use_cache_branch)"),
    Case("genai_llama_fp32", "genai", "tiny Llama, onnxruntime-genai model builder fp32"),
    Case("genai_llama_int4", "genai", "tiny Llama, onnxruntime-genai model builder int4 (MatMulNBits)"),
    # More architectures through the same tools (_tool_builders_more.py).
    Case("gpt2_optimum", "optimum", "tiny GPT-2, optimum-onnx text-generation-with-past"),
    Case("qwen2_optimum", "optimum", "tiny Qwen2, optimum-onnx text-generation-with-past"),
    Case("bart_merged", "optimum", "tiny BART, optimum-onnx merged decoder (If on use_cache_branch)"),
    Case("genai_gemma_fp32", "genai", "tiny Gemma, onnxruntime-genai model builder fp32"),
    Case("genai_qwen2_int4", "genai", "tiny Qwen2, onnxruntime-genai model builder int4 (MatMulNBits)"),
    Case("yolov8n_seg", "ultralytics", "YOLOv8n segmentation, imgsz 256"),
)}


def _python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and "is ignored" not in ln]
    return lines[-1].strip() if lines else "(no output)"


def tool_python(name: str, log=print) -> Path:
    """The tool's venv interpreter, creating the venv and installing the tool on first use (again
    only when its package list changes). Raises Unavailable when pip cannot install it."""
    import torch

    tool = TOOLS[name]
    venv_dir = VENVS / name
    no_deps = tuple(_torchvision_for_torch() if p == "TORCHVISION" else p for p in tool.no_deps)
    spec = json.dumps([torch.__version__, tool.packages, no_deps])
    stamp = venv_dir / ".onnxgrad-installed"
    if stamp.exists() and stamp.read_text() == spec:
        return _python(venv_dir)
    log(f"installing {name} into {venv_dir} ...")
    if not _python(venv_dir).exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(venv_dir)
    constraints = venv_dir / "constraints.txt"
    # The installed torch, exactly: anything that wants another one fails to resolve instead of downloading it.
    constraints.write_text(f"torch=={torch.__version__}\n")
    pip = [str(_python(venv_dir)), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(constraints)]
    for args in [list(tool.packages)] + ([["--no-deps", *no_deps]] if no_deps else []):
        done = subprocess.run(pip + args, capture_output=True, text=True)
        if done.returncode:
            raise Unavailable(f"pip install {' '.join(args)} failed: {_last_line(done.stderr or done.stdout)}")
    stamp.write_text(spec)
    return _python(venv_dir)


def _env(tool: Tool, venv_dir: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    env.update({k: v.format(venv=venv_dir) for k, v in tool.env})
    return env


def build(name: str, out_dir: str | os.PathLike = DEFAULT_OUT, log=print) -> Path:
    """Build case `name` into out_dir/name (replacing what was there) in its tool's venv; returns
    the folder. Raises Unavailable (tool not installable, or the build failed) with one line why."""
    case = CASES[name]
    python = tool_python(case.tool, log)
    folder = Path(out_dir).expanduser() / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    done = subprocess.run([str(python), str(BUILDERS), name, str(folder)], capture_output=True, text=True,
                          env=_env(TOOLS[case.tool], VENVS / case.tool), cwd=str(folder))
    (folder / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode or not (folder / "case.json").exists():
        raise Unavailable(f"build failed: {_last_line(done.stderr or done.stdout)} (log: {folder / 'build.log'})")
    return folder


def build_all(out_dir: str | os.PathLike = DEFAULT_OUT, names=None, log=print) -> dict[str, Path | str]:
    """Build every case (or `names`): name -> its folder, or the reason it was skipped. A tool that
    fails to install is tried once; its other cases are skipped with the same reason."""
    results: dict[str, Path | str] = {}
    broken: dict[str, str] = {}
    for name in names or CASES:
        tool = CASES[name].tool
        if tool in broken:
            results[name] = broken[tool]
        else:
            try:
                results[name] = build(name, out_dir, log)
            except Unavailable as e:
                results[name] = str(e)
                if not (VENVS / tool / ".onnxgrad-installed").exists():
                    broken[tool] = str(e)
        result = results[name]
        log(f"built {name}: {result}" if isinstance(result, Path) else f"skip {name}: {result}")
    return results


def load_case(folder: str | os.PathLike) -> dict:
    """case.json of a built case, with `path` (the model's absolute path) and `feeds` (name -> array)."""
    folder = Path(folder)
    case = json.loads((folder / "case.json").read_text())
    with np.load(folder / "feeds.npz") as npz:
        case["feeds"] = {k: npz[k] for k in npz.files}
    case["path"] = str(folder / case["model"])
    return case
