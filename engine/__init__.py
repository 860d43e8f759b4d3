"""onnxgrad's numeric core: run ONNX graphs on PyTorch and compute the ONNX Gradient operator.

Public API:
    load(path_or_proto) -> Model
    Model.run(feeds, device=, dtype=) -> dict[str, np.ndarray]
    Model.gradient(y=, xs=, zs=(), feeds=, dy=None, device=, dtype=) -> GradientResult
    Model.prepare_gradient(y=, xs=, zs=(), device=, dtype=) -> PreparedGradient (torch in, torch out;
        .forward / .backward / .seed / .nodes step through it, docs/python-api.md)
    Model.gradient_call(y, xs, zs=(), feeds=(), device=, dtype=) -> GradientCall, the call Model.gradient makes
    Model.selection(y, xs, zs) -> GradientSpec (validation only)
    Model.jvp(y, xs, tangents, zs=(), feeds=) -> JVPResult (J·v by forward mode); Model.hvp(y, xs, vs, ...)
        -> HVPResult (H·v, forward over reverse); prepare_jvp / prepare_hvp for repeated calls
    nonfinite_origin(model, y, xs, zs, feeds) -> Finding | None (where a gradient's NaN/Inf comes from)
    supported_ops() -> list[OpImpl]
    set_pause_hook(hook) / pause_point() / paced(items, every): long Python loops (layouts, plans) let an
        interactive front end go first
    GradManager(model, device=, dtype=) -> attach / record / run / backward / grad / params / save
    lower(model, y=None, xs=None, zs=None, dy=None, names=None) -> onnx.ModelProto (gradients as plain ONNX;
        engine.lowering.<family> holds the backward rules)
    lower_jvp(model, y, xs, zs=None, tangents=None, name=None) -> onnx.ModelProto (J·v as plain ONNX beside the
        forward pass; engine.lowering.jvp holds the forward rules)
    engine.distributed: init / broadcast_params / make_allreduce_cb, data-parallel GradManager training
        on torch.distributed (docs/gradmanager.md)

Names are imported on first use (PEP 562), so `import engine` and the CLI's argument parsing
stay free of torch; the op registry fills itself the first time an op is looked up.
"""
from __future__ import annotations

import importlib

from .errors import (
    BadAttributeError,
    DiffError,
    DistributedError,
    ExecutionError,
    FeedError,
    ForwardModeError,
    LoweringError,
    MemoryLimitError,
    ModelLoadError,
    OnnxGradError,
    RecordingError,
    SelectionError,
    UnsupportedOpError,
)

_LAZY = {
    "backend": ("OnnxGradBackend", "OnnxGradRep"),
    "modeldiff.compare": ("diff",),
    "modeldiff.report": ("DiffReport", "DiffValues"),
    "forward": ("HVPResult", "JVPResult", "PreparedHVP", "PreparedJVP"),
    "gradient.prepared": ("GradientOutput", "GradientResult", "PreparedGradient"),
    "gradmanager": ("Gradients", "GradManager", "Parameters"),
    "graphs": ("BackwardGraph", "Canvas", "GraphLayout", "GraphStats", "LayoutEdge", "LayoutNode", "TensorStats",
               "build_backward_graph", "gradient_with_stats", "layout_graph", "layout_near", "LocalLayout", "render",
               "render_graph", "to_dot"),
    "modelfile.index": ("GraphIndex", "TensorInfo"),
    "lowering": ("lower", "lower_jvp"),
    "model": ("Model",),
    "run.pacing": ("pause_point", "paced", "set_pause_hook"),
    "registry": ("OpImpl", "register", "supported_ops"),
    "gradient.selection": ("GradientSpec",),
    "verify": ("CheckReport", "ClaimedCheck", "Finding", "NodeCheck", "XCheck", "check", "register_op_with_vjp",
               "unregister_op", "nonfinite_origin"),
}
_SUBPACKAGES = ("modelfile", "run", "gradient", "ops", "verify", "graphs", "conformance", "cli", "lowering", "distributed",
                "modeldiff", "forward")
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "load", "Model", "GradientResult", "GradientOutput", "PreparedGradient", "GradientSpec",
    "GraphIndex", "TensorInfo", "OpImpl", "register", "supported_ops",
    "OnnxGradError", "ModelLoadError", "UnsupportedOpError", "SelectionError", "FeedError", "ExecutionError",
    "RecordingError", "BadAttributeError", "MemoryLimitError", "DiffError", "ForwardModeError",
    "GradManager", "Gradients", "Parameters",
    "check", "CheckReport", "XCheck", "NodeCheck", "ClaimedCheck", "Finding", "register_op_with_vjp", "unregister_op",
    "nonfinite_origin",
    "BackwardGraph", "build_backward_graph", "gradient_with_stats", "GraphStats", "TensorStats", "to_dot", "render",
    "render_graph",
    "layout_graph", "layout_near", "LocalLayout", "GraphLayout", "LayoutNode", "LayoutEdge", "Canvas",
    "OnnxGradBackend", "OnnxGradRep", "lower", "lower_jvp", "LoweringError", "DistributedError", "pause_point", "paced",
    "set_pause_hook", "diff", "DiffReport", "DiffValues", "JVPResult", "HVPResult", "PreparedJVP", "PreparedHVP",
]


def load(source, *, check: bool = True, compile: bool = False):
    """Load an ONNX model from a path, bytes or ModelProto; every op is resolved now. Returns a Model.
    `compile=True`: its plans run under torch.compile (optional, never required; docs/compile.md).

    The file is read and checked before torch is imported, so a bad file costs no torch start-up.
    """
    from .modelfile.reader import read_graph

    graph = read_graph(source, check=check)
    from .model import Model

    return Model(graph, compile=compile)


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        if name in _SUBPACKAGES:  # `import engine; engine.verify.fd` works as with eager imports
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
