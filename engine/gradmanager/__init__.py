"""GradManager: MegEngine-style attach / record / backward on ONNX models, and writing trained weights back."""
from .manager import Gradients, GradManager
from .params import Parameters

__all__ = ["GradManager", "Gradients", "Parameters"]
