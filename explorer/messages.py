"""App-wide messages: small dataclasses. Widget-local messages live in their widget.

Workers post these from their threads (post_message is thread-safe); handlers on the App update
the session and the widgets. Tests record them with `run_test(message_hook=...)`.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class CursorMoved(Message):
    """The user moved to a node and/or tensor (graph, list, results table or step mode)."""

    node_index: int | None
    tensor: str | None


class InputAnswered(Message):
    """Posted behind what a key's action posted, along the same path: when it reaches the App,
    those messages were handled and the frame showing them is next (explorer/foreground.py)."""


@dataclass
class SelectionChanged(Message):
    y: str | None
    xs: tuple[str, ...]
    zs: tuple[str, ...]
    error: str | None


@dataclass
class FeedChanged(Message):
    tensor: str
    description: str | None  # None: the feed was removed


@dataclass
class SettingsChanged(Message):
    device: str
    dtype: str
    view: str


@dataclass
class WorkStarted(Message):
    kind: str  # "gradient", "check", "export", "values", "step", "layout"
    label: str


@dataclass
class WorkProgress(Message):
    kind: str
    done: int
    total: int
    stage: str

    def can_replace(self, message: Message) -> bool:  # a flood of progress keeps only the newest
        return isinstance(message, WorkProgress) and message.kind == self.kind


@dataclass
class WorkFinished(Message):
    kind: str
    outcome: str  # "done", "cancelled", "failed", "stale"
    detail: str = ""


@dataclass
class GradientReady(Message):
    generation: int
    result: object  # engine.GradientResult
    stats: object | None
    origin: object | None = None  # engine Finding: where a NaN/Inf in the gradients comes from
    summaries: dict | None = None  # x -> explorer.summaries.Summary of its gradient


@dataclass
class CheckReady(Message):
    generation: int
    report: object  # engine CheckReport


@dataclass
class ValuesReady(Message):
    generation: int  # the session's values_generation when the job was made
    values: dict
    everything: bool = False  # every value one pass can give (what is missing needs asking one by one)


@dataclass
class SummaryReady(Message):
    kind: str  # "value" or "gradient"
    name: str
    array: object  # the array summarized: the summary holds while it is the one shown
    summary: object  # explorer.summaries.Summary


@dataclass
class LayoutReady(Message):
    key: tuple  # (view, spec or None): layouts are cached under it
    layout: object  # engine.GraphLayout
    canvas: object = None  # its engine.Canvas, indexed in the worker so the swap costs the UI no time
    model: object = None  # the engine.Model laid out: another model's layout is dropped


@dataclass
class LocalLayoutReady(Message):
    """The neighbourhood of the cursor, drawn while the whole graph is still being laid out."""

    key: tuple
    local: object  # engine.LocalLayout
    canvas: object = None
    model: object = None


@dataclass
class ExportDone(Message):
    what: str
    path: str


@dataclass
class ModelOpened(Message):
    label: str
    model: object  # engine.Model


@dataclass
class TraceReady(Message):
    """The forward frames: step mode opens on them while the reverse pass is traced."""

    generation: int
    trace: object  # explorer.stepper.Trace, its first frames
    total: int  # nodes each pass visits
    shown: object = None  # threading.Event the step screen sets once it is drawn


@dataclass
class TraceChunk(Message):
    """Reverse frames traced since the last chunk; `grads` (the accumulated gradients) on the last."""

    generation: int
    frames: tuple  # explorer.stepper.Frame
    done: int
    total: int
    grads: dict | None = None


@dataclass
class DiffReady(Message):
    """A diff finished: diff mode shows it, unless another model was opened meanwhile."""

    model: object  # the engine.Model diffed (A)
    report: object  # engine.DiffReport, with its values kept
    choice: object  # explorer.diff_state.DiffChoice: what A was compared with
    basis: tuple = ()  # explorer.diff_state.diff_basis of the session when the diff was asked for
