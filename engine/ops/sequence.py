"""Sequence ops. An ONNX sequence is a Python list of tensors; ops never mutate their input list.
Also the Optional ops: an optional value is the value itself, or None when empty."""
from __future__ import annotations

import torch

from ..errors import OnnxGradError
from ..registry import describe, register
from .shape import int_list, int_scalar, norm_axis


def _position(seq, position, *, insert=False):
    # Insert accepts [-n, n] and, like list.insert, -1 lands before the last tensor.
    n = len(seq)
    p = int_scalar(position)
    if not -n <= p < n + (1 if insert else 0):
        raise OnnxGradError(f"sequence position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


@describe("SequenceConstruct", needs="", rule=("dinputsᵢ = element i of the sequence's gradient",))
@register("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    return list(inputs)


@describe("SequenceEmpty", no_gradient="no inputs")
@register("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    return []


@describe("SequenceAt", needs="in1", rule="dinput_sequence = dY at the position, zeros elsewhere")
@register("SequenceAt", since=11)
def sequence_at(input_sequence, position):
    return input_sequence[_position(input_sequence, position)]


@describe("SequenceInsert", needs="in2",
          rule=("dinput_sequence = the sequence's gradient without the inserted position",
                "dtensor = the sequence's gradient at the position",
                None))
@register("SequenceInsert", since=11)
def sequence_insert(input_sequence, tensor, position=None):
    out = list(input_sequence)
    out.insert(len(out) if position is None else _position(out, position, insert=True), tensor)
    return out


@describe("SequenceErase", needs="in1",
          rule="dinput_sequence = the sequence's gradient with zeros put back at the erased position")
@register("SequenceErase", since=11)
def sequence_erase(input_sequence, position=None):
    if not input_sequence:
        raise OnnxGradError("SequenceErase on an empty sequence")
    out = list(input_sequence)
    del out[-1 if position is None else _position(out, position)]
    return out


@describe("SequenceLength", no_gradient="an integer result")
@register("SequenceLength", since=11)
def sequence_length(input_sequence, *, device):
    return torch.tensor(len(input_sequence), dtype=torch.int64, device=device)


@describe("ConcatFromSequence", needs="", rule=("dinput_sequence = dY split back into the elements along axis {axis}",))
@register("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, *, axis, new_axis=0):
    if not input_sequence:
        raise OnnxGradError("ConcatFromSequence on an empty sequence")
    rank = input_sequence[0].dim()
    if new_axis:
        return torch.stack(input_sequence, dim=norm_axis(axis, rank + 1, "ConcatFromSequence"))
    return torch.cat(input_sequence, dim=norm_axis(axis, rank, "ConcatFromSequence"))


@describe("SplitToSequence", needs="", rule="dinput = the sequence's gradients concatenated along axis {axis}")
@register("SplitToSequence", since=11)
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):  # noqa: A002 - ONNX input name
    a = norm_axis(axis, input.dim(), "SplitToSequence")
    if split is None:
        parts = torch.split(input, 1, dim=a)
        return [p.squeeze(a) for p in parts] if not keepdims else list(parts)
    sizes = int_list(split)
    if split.dim() == 0:
        # a scalar is a chunk length; only the last chunk may be shorter
        return list(torch.split(input, sizes[0], dim=a))
    if sum(sizes) != input.shape[a]:
        raise OnnxGradError(f"SplitToSequence sizes {sizes} do not add up to {input.shape[a]}, the size of axis {axis}")
    return list(torch.split(input, sizes, dim=a))


@describe("Optional", needs="", rule="dinput = the optional's gradient")
@register("Optional", since=15)
def optional(x=None, *, type=None):  # noqa: A002  (ONNX attribute name)
    if x is None and type is None:
        raise OnnxGradError("Optional needs an input or a type attribute")
    return x


@describe("OptionalHasElement", no_gradient="a boolean result")
@register("OptionalHasElement", since=15)
def optional_has_element(x=None, *, device):
    return torch.tensor(x is not None, device=device)


@describe("OptionalGetElement", needs="", rule="dinput = dY")
@register("OptionalGetElement", since=15)
def optional_get_element(x):
    if x is None:
        raise OnnxGradError("OptionalGetElement: the optional is empty")
    return x
