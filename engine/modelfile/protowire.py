"""Protobuf's wire format, just enough of it to find where an ONNX file keeps its weights.

A model file is a serialized ModelProto: its graph (field 7) holds initializers (field 5), TensorProtos
whose raw_data (field 9) carries the bytes. Walking the records' headers gives each raw_data payload's
offset in the file without touching the payload; the same bytes with those payloads cut out (the
*skeleton*) are what protobuf parses, the checker checks and shape inference reads. Writing a model back
is the same walk the other way: payloads spliced into a serialized skeleton, straight from where the
weights live, so that nothing holds a second copy of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9
LENGTH_DELIMITED = 2


class WireError(ValueError):
    """The bytes are not the protobuf layout this module understands (protobuf itself says why)."""


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # most tags and short lengths: one byte
            return b, pos + 1
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class Field(NamedTuple):
    number: int
    wire: int
    start: int  # the tag's first byte
    length_at: int  # a length-delimited field's length varint (== value_start otherwise)
    value_start: int
    value_end: int


def fields(buf, start: int, end: int) -> Iterator[Field]:
    """The fields of the message serialized in buf[start:end], in file order."""
    pos = start
    while pos < end:
        tag, after_tag = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == LENGTH_DELIMITED:
            length, value_start = read_varint(buf, after_tag, end)
            value_end = value_start + length
            if value_end > end:
                raise WireError("a length runs past the end of its message")
        elif wire == 0:
            value_start, value_end = after_tag, read_varint(buf, after_tag, end)[1]
        elif wire in (1, 5):
            value_start, value_end = after_tag, after_tag + (8 if wire == 1 else 4)
            if value_end > end:
                raise WireError("a fixed-size field runs past the end of its message")
        else:  # groups (3, 4) are not in ONNX's schema
            raise WireError(f"unsupported wire type {wire}")
        if number == 0:
            raise WireError("field number 0")
        yield Field(number, wire, pos, after_tag, value_start, value_end)
        pos = value_end


def graph_field(buf, end: int) -> Field | None:
    """The model's one graph record; WireError when it is repeated (protobuf would merge them)."""
    graph = None
    for f in fields(buf, 0, end):
        if f.number == MODEL_GRAPH:
            if f.wire != LENGTH_DELIMITED or graph is not None:
                raise WireError("graph field repeated or not length-delimited")
            graph = f
    return graph


def initializer_records(buf, graph: Field) -> Iterator[Field]:
    for f in fields(buf, graph.value_start, graph.value_end):
        if f.number == GRAPH_INITIALIZER:
            if f.wire != LENGTH_DELIMITED:
                raise WireError("initializer not length-delimited")
            yield f


def raw_data_fields(buf, record: Field) -> list[Field]:
    out = []
    for f in fields(buf, record.value_start, record.value_end):
        if f.number == TENSOR_RAW_DATA:
            if f.wire != LENGTH_DELIMITED:
                raise WireError("raw_data not length-delimited")
            out.append(f)
    return out


@dataclass(frozen=True)
class Payload:
    """Where the raw_data of the `ordinal`-th initializer lies in the buffer scanned."""

    ordinal: int
    offset: int
    length: int


Piece = "bytes | memoryview"
Edit = Callable[[int, Field], "Sequence[bytes | memoryview] | None"]


def splice_initializers(buf, end: int, edit: Edit) -> list:
    """The model in buf[:end] as pieces to concatenate, each initializer record whose `edit(ordinal,
    record)` returns pieces getting those as its new content (lengths of the record and the graph fixed)."""
    view = memoryview(buf)[:end]
    graph = graph_field(buf, end)
    if graph is None:
        return [view]
    content: list = []
    cursor = graph.value_start
    for k, record in enumerate(initializer_records(buf, graph)):
        new = edit(k, record)
        if new is None:
            continue
        content.append(view[cursor:record.length_at])
        content.append(encode_varint(sum(len(p) for p in new)))
        content.extend(new)
        cursor = record.value_end
    content.append(view[cursor:graph.value_end])
    size = sum(len(p) for p in content)
    return [view[:graph.length_at], encode_varint(size), *content, view[graph.value_end:]]


def strip_raw_data(buf, end: int, threshold: int) -> tuple[list, list[Payload]]:
    """The skeleton of the model in buf[:end] (pieces) without the raw_data of initializers holding at
    least `threshold` bytes, and where those payloads are. Smaller tensors stay: shape inference reads
    the shape-like ones."""
    view = memoryview(buf)
    payloads: list[Payload] = []

    def cut(k: int, record: Field):
        raws = raw_data_fields(buf, record)
        if not raws or raws[-1].value_end - raws[-1].value_start < threshold:
            return None
        last = raws[-1]  # protobuf keeps the last of a repeated scalar field
        payloads.append(Payload(k, last.value_start, last.value_end - last.value_start))
        pieces, cursor = [], record.value_start
        for f in raws:
            pieces.append(view[cursor:f.start])
            cursor = f.value_end
        pieces.append(view[cursor:record.value_end])
        return pieces

    return splice_initializers(buf, end, cut), payloads


def with_raw_data(skeleton: bytes, data: dict[int, memoryview]) -> list:
    """Pieces of a serialized model: `skeleton` with raw_data `data[k]` added to the k-th initializer."""
    tag = encode_varint(TENSOR_RAW_DATA << 3 | LENGTH_DELIMITED)
    view = memoryview(skeleton)

    def add(k: int, record: Field):
        if k not in data:
            return None
        payload = data[k]
        return [view[record.value_start:record.value_end], tag, encode_varint(len(payload)), payload]

    return splice_initializers(skeleton, len(skeleton), add)
