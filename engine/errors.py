"""Errors the engine raises on bad input. Every message is one line a user can act on."""


class OnnxGradError(ValueError):
    """Base class: the CLI turns any of these into a one-line message and exit code 2."""


class ModelLoadError(OnnxGradError):
    """The file or proto cannot be read, fails the checker, or is not a DAG."""


class UnsupportedOpError(OnnxGradError):
    """A node's (domain, op_type, opset) has no implementation in the registry.

    `op` ("com.example::MyOp") and `node` (its display name) say which, when known.
    """

    def __init__(self, message: str = "", op: str = "", node: str = ""):
        super().__init__(message)
        self.op, self.node = op, node


class SelectionError(OnnxGradError):
    """A (y, xs, zs) selection that breaks the ONNX Gradient operator's rules."""


class FeedError(OnnxGradError):
    """A value fed to the model is missing, misnamed, or has the wrong shape or dtype."""


class ExecutionError(OnnxGradError):
    """An op failed while running; the message names the node."""


class MemoryLimitError(ExecutionError):
    """A step would allocate more than the machine can still give (engine/run/memory.py), or its
    allocation failed: the message names the node, the output, and its shape and bytes where known."""


class RecordingError(OnnxGradError):
    """A GradManager used out of order: backward with nothing recorded, or recording twice."""


class LoweringError(OnnxGradError):
    """A Gradient cannot be rewritten into standard ONNX ops: a node without a backward rule, unknown shapes."""


class DistributedError(OnnxGradError):
    """Processes training together disagree or stopped answering: a rank died, never joined, timed
    out, or runs another model or attach set. The message names the rank and what differs."""


class InputShapeError(OnnxGradError):
    """A node's input has a rank, dims, type or value its op refuses (the op's validator said so, before
    the forward ran): the message names the input by its schema name, the expected and the actual."""


class BadAttributeError(OnnxGradError):
    """A node's integer attribute is outside what its op takes, given its inputs' ranks and dims (an axis
    past the rank, a stride of 0, a group that does not divide the channels): the message names the
    attribute, its value and the range it may have, before the forward allocates anything."""


class DiffError(OnnxGradError):
    """`diff` was asked for something it cannot compare: a dtype or onnxruntime with two models, neither,
    an unknown dtype; the message says which."""


class ForwardModeError(OnnxGradError):
    """A forward-mode derivative (J·v, H·v) cannot go through a node: its op has no forward rule, or it
    drops the tangent it reads; the message names the node, so the tangent is never silently zero.

    `node_index` (into the graph's nodes) says which, when known; `custom`: a custom op registered
    without a jvp, whose author is asked for one rather than worked around."""

    def __init__(self, message: str = "", node_index: int | None = None, custom: bool = False):
        super().__init__(message)
        self.node_index, self.custom = node_index, custom
