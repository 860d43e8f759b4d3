"""Writing a model back from wherever its weights live, never holding a second copy of them.

The skeleton (the model without its large initializers' bytes) is serialized by protobuf; the bytes
are spliced into it (engine/modelfile/protowire.py) or, when the model would pass protobuf's 2 GB or when asked,
written to one external data file beside it. Bytes still in a file the model was read from are
copied by the kernel (copy_file_range), holes kept, so a sparse model stays sparse and no page of
an untouched weight enters this process. Files are replaced atomically: a model mapped from the old
ones stays readable.
"""
from __future__ import annotations

import os

from onnx import ModelProto, TensorProto

from ..errors import OnnxGradError
from . import protowire
from .reader import STRIP_BYTES
from .weights import FileRange

PROTOBUF_LIMIT = 2**31 - 1
ALIGN = 4096  # external data offsets, so that every tensor maps without a copy


def _data_for(model: ModelProto, data) -> dict[int, memoryview | FileRange]:
    out = {}
    for k, t in enumerate(model.graph.initializer):
        if t.name in data:
            out[k] = _bytes_of(data[t.name])
    return out


def _bytes_of(value) -> memoryview | FileRange:
    if isinstance(value, FileRange):
        return value
    view = memoryview(value)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def write(model: ModelProto, data, path: str, external: bool | None = None) -> bool:
    """Write `model` to `path`, the initializers named in `data` (name -> bytes-like, little-endian, or
    a FileRange) taking those bytes. `external`: None writes them to `path`.data when the model would
    pass protobuf's 2 GB. Returns whether external data was written."""
    path = os.fspath(path)
    payloads = _data_for(model, data)
    if external is None:
        external = model.ByteSize() + sum(len(p) + 16 for p in payloads.values()) > PROTOBUF_LIMIT
    try:
        if external:
            _write_external(model, payloads, path)
        else:
            pieces = protowire.with_raw_data(_inline(model, payloads).SerializeToString(), payloads)
            _write_pieces(path, pieces)
    except OSError as exc:
        raise OnnxGradError(f"cannot write {path}: {exc.strerror or exc}") from None
    return external


def _inline(model: ModelProto, payloads: dict) -> ModelProto:
    """`model`, or a copy whose initializers about to take their bytes no longer say they are external."""
    inits = model.graph.initializer
    if not any(inits[k].data_location == TensorProto.EXTERNAL or len(inits[k].external_data) for k in payloads):
        return model
    out = ModelProto()
    out.CopyFrom(model)
    for k in payloads:
        out.graph.initializer[k].ClearField("external_data")
        out.graph.initializer[k].ClearField("data_location")
    return out


def _write_pieces(path: str, pieces) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        try:
            size = 0
            for p in pieces:
                if isinstance(p, FileRange):
                    _copy_range(p, fd, size)
                else:
                    _write_all(fd, memoryview(p).cast("B"), size)
                size += len(p)
            os.ftruncate(fd, size)  # a range ending in a hole was skipped, not written
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_all(fd: int, view: memoryview, at: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _copy_range(r: FileRange, fd: int, at: int) -> None:
    """Copy `r` to `fd` at `at` in the kernel, leaving its holes holes (a sparse file stays sparse);
    from the mapping when the file on disk is no longer the one mapped."""
    r.file.require_unchanged()
    source = r.file.copy_source()
    if source is None:
        _write_all(fd, r.view() if r.view() is not None else r.read(), at)
        return
    src, owned = source
    try:
        pos, end = r.offset, r.offset + r.length
        while pos < end:
            data = _seek(src, pos, getattr(os, "SEEK_DATA", None), default=pos, past=end)
            if data > pos:  # a hole: nothing to write
                pos = min(data, end)
                continue
            stop = min(_seek(src, pos, getattr(os, "SEEK_HOLE", None), default=end, past=end), end)
            while pos < stop:
                n = _kernel_copy(src, fd, pos, at + pos - r.offset, stop - pos)
                if n <= 0:
                    raise OSError(f"{r.file.path} ended early: {stop - pos} bytes missing at offset {pos}")
                pos += n
    finally:
        if owned:
            os.close(src)


def _seek(fd: int, pos: int, whence, default: int, past: int) -> int:
    if whence is None:
        return default
    try:
        return os.lseek(fd, pos, whence)
    except OSError:  # ENXIO: no data after pos (all hole); other errors: treat as data
        return past if whence == getattr(os, "SEEK_DATA", None) else default


def _kernel_copy(src: int, dst: int, src_at: int, dst_at: int, count: int) -> int:
    count = min(count, 1 << 30)
    if hasattr(os, "copy_file_range"):
        try:
            return os.copy_file_range(src, dst, count, src_at, dst_at)
        except OSError:
            pass
    data = os.pread(src, min(count, 1 << 24), src_at)
    _write_all(dst, memoryview(data), dst_at)
    return len(data)


def _write_external(model: ModelProto, payloads: dict, path: str) -> None:
    out = ModelProto()
    out.CopyFrom(model)
    location = os.path.basename(path) + ".data"
    pieces, offset = [], 0
    for k, t in enumerate(out.graph.initializer):
        if k not in payloads:
            continue
        payload = payloads[k]
        t.ClearField("external_data")
        t.ClearField("raw_data")
        if len(payload) < STRIP_BYTES:
            t.data_location = TensorProto.DEFAULT
            t.raw_data = _as_bytes(payload)
            continue
        pad = -offset % ALIGN
        pieces += [b"\0" * pad, payload]
        offset += pad
        for key, value in (("location", location), ("offset", offset), ("length", len(payload))):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        t.data_location = TensorProto.EXTERNAL
        offset += len(payload)
    _write_pieces(os.path.join(os.path.dirname(path), location), pieces)
    _write_pieces(path, [out.SerializeToString()])


def materialize(model: ModelProto, data) -> ModelProto:
    """A complete copy of `model`: the initializers named in `data` hold their bytes as raw_data."""
    out = ModelProto()
    out.CopyFrom(model)
    for k, payload in _data_for(out, data).items():
        t = out.graph.initializer[k]
        t.ClearField("external_data")
        t.data_location = TensorProto.DEFAULT
        t.raw_data = _as_bytes(payload)
    return out


def _as_bytes(payload) -> bytes:
    return (payload.read() if isinstance(payload, FileRange) else payload).tobytes()
