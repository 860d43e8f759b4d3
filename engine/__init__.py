"""onnxgrad's numeric core: run ONNX graphs on PyTorch and compute the ONNX Gradient operator.

Public API:
    load(path_or_proto) -> Model
    Model.run(feeds, device=, dtype=) -> dict[str, np.ndarray]
    Model.gradient(y=, xs=, zs=(), feeds=, dy=None, device=, dtype=) -> GradientResult
    Model.prepare_gradient(y=, xs=, zs=(), device=, dtype=) -> PreparedGradient (torch in, torch out)
    Model.selection(y, xs, zs) -> GradientSpec (validation only)
    supported_ops() -> list[OpImpl]
    GradManager(model, device=, dtype=) -> attach / record / run / backward / grad / params / save
"""
from . import ops as _ops  # noqa: F401  (fills the registry)
from .backend import OnnxGradBackend, OnnxGradRep
from .errors import ExecutionError, FeedError, ModelLoadError, OnnxGradError, RecordingError, SelectionError, UnsupportedOpError
from .gradient import GradientOutput, GradientResult, PreparedGradient
from .gradmanager import Gradients, GradManager, Parameters
from .graphs import (
                     BackwardGraph,
                     Canvas,
                     GraphLayout,
                     GraphStats,
                     LayoutEdge,
                     LayoutNode,
                     TensorStats,
                     build_backward_graph,
                     gradient_with_stats,
                     layout_graph,
                     render,
                     to_dot,
)
from .loader import GraphIndex, TensorInfo
from .model import Model, load
from .registry import OpImpl, register, supported_ops
from .selection import GradientSpec
from .verify import CheckReport, ClaimedCheck, Finding, NodeCheck, XCheck, check, register_op_with_vjp, unregister_op

__all__ = [
    "load", "Model", "GradientResult", "GradientOutput", "PreparedGradient", "GradientSpec",
    "GraphIndex", "TensorInfo", "OpImpl", "register", "supported_ops",
    "OnnxGradError", "ModelLoadError", "UnsupportedOpError", "SelectionError", "FeedError", "ExecutionError",
    "RecordingError", "GradManager", "Gradients", "Parameters",
    "check", "CheckReport", "XCheck", "NodeCheck", "ClaimedCheck", "Finding", "register_op_with_vjp", "unregister_op",
    "BackwardGraph", "build_backward_graph", "gradient_with_stats", "GraphStats", "TensorStats", "to_dot", "render",
    "layout_graph", "GraphLayout", "LayoutNode", "LayoutEdge", "Canvas",
    "OnnxGradBackend", "OnnxGradRep",
]
