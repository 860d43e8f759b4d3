"""Made-up feeds that make sense together for an LLM with past key values.

Exporters (optimum, onnxruntime-genai, seq2seq merged decoders) declare such a model's inputs with
named dims: `past_sequence_length`, `sequence_length`, `past_sequence_length + sequence_length` or
`total_sequence_length`, and head sizes like genai's `kv_cache_dim`. Every dim at 1 gives a model
that onnxruntime refuses and the engine runs into nonsense. With no feeds, such a model gets:

- a past of PAST positions (`--past N`, `past=` in Python, or a dim that sets it) after SEQ current
  ones, and the total length past + seq wherever a dim names it;
- its head sizes and kv head counts from the model itself (`head_sizes`);
- masks of ones over past and current positions, position ids past .. past+seq-1, genai's
  seqlens_k / total_sequence_length inputs consistent with them, token ids in the embedding's range
  and `use_cache_branch` on when there is a past.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..errors import FeedError
from ..modelfile.dim_expr import evaluate, is_expression, names_in, solve
from ..modelfile.index import GraphIndex
from .dims import sized
from .head_sizes import head_sizes

PAST = 4  # positions already cached
SEQ = 2  # positions this step adds
ENCODER = 3  # a seq2seq decoder's encoder positions: over one, cross-attention ignores its keys


def is_past_input(graph: GraphIndex, name: str) -> bool:
    """past_key_values.0.key, past_key.0, past.0.decoder.value, past_0, kv_cache.0.key, ...: a float
    tensor of rank 3 or more."""
    low, info = name.lower(), graph.types.get(name)
    return (("past" in low or ("cache" in low and any(k in low for k in ("key", "value", "kv"))))
            and info is not None and info.is_float and info.shape is not None and len(info.shape) >= 3)


def _names(graph: GraphIndex, tensors) -> list[str]:
    out = []
    for t in tensors:
        info = graph.types.get(t)
        for d in (info.shape if info is not None and info.shape is not None else ()):
            if isinstance(d, str) and d:
                out.extend(names_in(d))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class PastLayout:
    """Which inputs hold the past and which dims count past, current and total positions."""

    past_inputs: tuple[str, ...]
    past_dims: tuple[str, ...]
    seq_dims: tuple[str, ...]
    total_dims: tuple[str, ...]
    totals: tuple[str, ...]  # expressions over a past and a current dim (optimum's attention_mask)
    encoder_dims: tuple[str, ...]
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)  # head dim -> (size, where read)


def past_layout(graph: GraphIndex) -> PastLayout | None:
    """The layout of an LLM with past, or None when the model has no past input with a past dim."""
    past_inputs = tuple(n for n in graph.inputs if is_past_input(graph, n))
    if not past_inputs:
        return None
    past_dims = tuple(d for d in _names(graph, past_inputs) if "past" in d.lower())
    if not past_dims:
        return None
    heads: dict[str, tuple[int, str]] = {}
    for n in past_inputs:
        sizes, source = head_sizes(graph, n)
        for axis, d in enumerate(graph.types[n].shape):
            if isinstance(d, str) and axis in sizes and not set(names_in(d)) & set(past_dims):
                heads.setdefault(d, (sizes[axis], source))
    every = _names(graph, graph.inputs)
    encoder_dims = tuple(d for d in every if "encoder" in d.lower() and any(w in d.lower() for w in ("seq", "len")))
    others = [d for d in every if d not in past_dims and d not in heads
              and not any(w in d.lower() for w in ("batch", "encoder", "max"))]
    total_dims = [d for d in others if "total" in d.lower()]
    for mask in (n for n in graph.inputs if "attention_mask" in n.lower() and "encoder" not in n.lower()):
        shape = graph.types[mask].shape if mask in graph.types else None
        last = shape[-1] if shape else None
        if isinstance(last, str) and not is_expression(last) and last not in past_dims:
            total_dims.append(last)
    seq_dims = tuple(d for d in others if d not in total_dims and any(w in d.lower() for w in ("seq", "len")))
    declared = dict.fromkeys(d for n in graph.inputs if n in graph.types for d in (graph.types[n].shape or ()))
    totals = tuple(d for d in declared if is_expression(d) and set(names_in(d)) & set(past_dims))
    return PastLayout(past_inputs, past_dims, seq_dims, tuple(dict.fromkeys(total_dims)), totals, encoder_dims, heads)


def with_past(graph: GraphIndex, dims: Mapping[str, int] | None, past: int | None) -> dict[str, int]:
    """`dims` with every past-length dim of the model set to `past` (`--past N`); FeedError when the
    model has no past, or `past` is negative."""
    dims = dict(dims or {})
    if past is None:
        return dims
    layout = past_layout(graph)
    if layout is None:
        raise FeedError("--past: this model has no past key values (no input named like past_key_values.* "
                        "with a past_sequence_length dim)")
    if isinstance(past, bool) or not isinstance(past, int) or past < 0:
        raise FeedError(f"--past must be a whole number of positions (0 or more), not {past!r}")
    for d in layout.past_dims:
        if dims.get(d, past) != past:
            raise FeedError(f"--past {past} contradicts --dim {d}={dims[d]}")
        dims[d] = past
    return dims


@dataclass(frozen=True)
class PastPlan:
    """The sizes every made-up value of an LLM with past follows, and the values that are not a SPEC."""

    layout: PastLayout
    dims: dict[str, int]
    past: int
    seq: int

    @property
    def summary(self) -> str:
        head = "".join(f"; {d}={size} from {source}" for d, (size, source) in list(self.layout.heads.items())[:1])
        return f"past of {_positions(self.past)} before {self.seq} current, set with --past N{head}"

    def choose(self, graph: GraphIndex, name: str, spec: str, seed: int) -> tuple[np.ndarray | None, str, str]:
        """(value or None, how, why) for an unfed graph input: a value where a SPEC cannot say it."""
        low, info = name.lower(), graph.types.get(name)
        integer = info is not None and bool(info.elem_type) and not info.is_float
        total = self.past + self.seq
        if name in self.layout.past_inputs:
            selfs = [n for n in self.layout.past_inputs if set(_names(graph, [n])) & set(self.layout.past_dims)]
            if name not in selfs:
                return None, spec, "cross-attention keys and values over the encoder's positions"
            return None, spec, self.summary if name == selfs[0] else f"past of {_positions(self.past)}"
        if not integer or info.shape is None:
            return None, spec, ""
        shape = sized(info.shape, self.dims)
        dtype = np.dtype(_np_type(info.elem_type))
        if "use_cache" in low:
            return None, "ones" if self.past else "zeros", f"the with-past branch: past of {self.past}" if self.past \
                else "no past"
        if "mask" in low and "encoder" not in low and "cross" not in low:
            return None, "ones", f"attend to the past {self.past} and current {self.seq} positions"
        if "position" in low or "cache_position" in low:
            start = self.past if shape and shape[-1] == self.seq else 0
            value = np.broadcast_to(np.arange(start, start + (shape[-1] if shape else 1)), shape).astype(dtype)
            return value, f"{start}..{start + (shape[-1] if shape else 1) - 1}", f"positions after the past of {self.past}"
        if "seqlens_k" in low:
            return np.full(shape, total - 1, dtype), f"{total - 1}", "the past and current positions, less one"
        if "total_sequence_length" in low:
            return np.full(shape, total, dtype), f"{total}", "the past and current positions"
        if "input_ids" in low and spec == "zeros" and name in graph.inputs:
            return None, f"random:{seed + 1 + graph.inputs.index(name)}", "token ids in the embedding's range"
        return None, spec, ""


def _positions(n: int) -> str:
    return f"{n} position{'s' * (n != 1)}"


def _np_type(elem_type: int):
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem_type)


def past_plan(graph: GraphIndex, sizes: Mapping[str, int]) -> PastPlan | None:
    """Sizes for an LLM with past: those `sizes` sets (--dim, --past, what feeds show) and, for the
    rest, a past of PAST and SEQ current positions; None for other models."""
    layout = past_layout(graph)
    if layout is None:
        return None
    out = dict(sizes)

    def known(names) -> int | None:
        return next((int(out[d]) for d in names if d in out), None)

    past, seq = known(layout.past_dims), known(layout.seq_dims)
    if seq is None:  # older optimum: a mask over `past_sequence_length + 1` fixes one current position
        seq = next((k for d in layout.totals if set(names_in(d)) <= set(layout.past_dims)
                    and (k := evaluate(d, dict.fromkeys(layout.past_dims, 0))) and k > 0), None)
    total = known(layout.total_dims)
    if total is None:
        total = next((int(out[d]) for d in layout.totals if d in out), None)
    if total is not None and (past is None or seq is None):
        if seq is None:
            seq = total - past if past is not None else min(SEQ, total)
        past = total - seq if past is None else past
    past = PAST if past is None else past
    seq = SEQ if seq is None else seq
    if past < 0:
        raise FeedError(f"the fed values show {total} positions in all, fewer than the {seq} current ones")
    for names, size in ((layout.past_dims, past), (layout.seq_dims, seq), (layout.total_dims, past + seq),
                        (layout.encoder_dims, ENCODER)):
        for d in names:
            out.setdefault(d, size)
    for d, (size, _) in layout.heads.items():
        out.setdefault(d, size)
    for d in layout.totals:  # a total seen in a feed may still give a name no role covers
        if d in out and evaluate(d, out) is None and (hit := solve(d, out[d], out)):
            out.setdefault(*hit)
    return PastPlan(layout, out, past, seq)


def coherent_dims(graph: GraphIndex, sizes: Mapping[str, int]) -> dict[str, int]:
    """`sizes`, completed for an LLM with past as `past_plan` does (other models: unchanged)."""
    plan = past_plan(graph, sizes)
    return dict(sizes) if plan is None else plan.dims
