"""Initializer values, read when first asked for and never through protobuf.

A weight lives in one of three places: inside the .onnx file (read with one positional read into an
array of its own, so it is aligned and the file may change afterwards without harm), in an external
data file (memory-mapped: the page cache is the only copy, and what is never read costs nothing), or,
for tensors under a kilobyte, in the parsed proto itself. `Weights` maps each initializer's name to its
value as a numpy array, in its ONNX element type, without copying where the bytes allow it.
"""
from __future__ import annotations

import mmap
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelLoadError

# Element types whose values are packed below a byte: numpy_helper unpacks them.
PACKED = frozenset(getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3",
                                                      "FLOAT6E3M2") if hasattr(TensorProto, n))
BITS = {getattr(TensorProto, n): b for n, b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2),
                                                ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, n)}


class DataFile:
    """A file weights are read from. Unmapped (the .onnx file itself): kept open, each tensor read
    once into an array of its own. `mapped` (external data): mapped privately and the descriptor
    closed (the mapping holds the file); aligned tensors are views of its pages."""

    def __init__(self, path: str, fd: int, mapped: bool):
        self.path = path
        self.stat = os.fstat(fd)
        self.size = self.stat.st_size
        self.map = self.fd = None
        if mapped and self.size:
            try:  # private: a tensor written in place (nothing here does) could never reach the file
                self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
            finally:
                os.close(fd)
        else:
            self.fd = fd
            self._finalizer = weakref.finalize(self, os.close, fd)
        self._lock = threading.Lock()

    def read(self, offset: int, length: int, dtype: np.dtype) -> np.ndarray:
        """`length` bytes at `offset` as a flat array of `dtype`: a view of the mapping (a copy of
        it where unaligned), else one read into a new array."""
        if self.map is not None:
            arr = np.frombuffer(self.map, dtype=np.uint8, count=length, offset=offset)
            return arr.view(dtype) if offset % dtype.itemsize == 0 else arr.copy().view(dtype)
        if self.fd is None:  # an empty file: only empty tensors lie in it
            return np.empty(0, dtype)
        self.require_unchanged()
        out = np.empty(length, np.uint8)
        got = self._read_into(out, offset)
        if got != length:
            raise ModelLoadError(f"{self.path} changed since it was loaded ({got} of {length} bytes at offset {offset}): "
                                 "load it again")
        return out.view(dtype)

    def _read_into(self, out: np.ndarray, offset: int) -> int:
        view, done = memoryview(out), 0
        while done < len(out):
            if hasattr(os, "preadv"):
                n = os.preadv(self.fd, [view[done:]], offset + done)
            else:  # no positional read here: one reader at a time
                with self._lock:
                    os.lseek(self.fd, offset + done, os.SEEK_SET)
                    n = os.readv(self.fd, [view[done:]])
            if n <= 0:
                break
            done += n
        return done

    def _identity(self, st) -> tuple:
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def require_unchanged(self) -> None:
        """ModelLoadError when the bytes this file gives are no longer the ones loaded. A mapped file
        replaced by another (a new inode) is fine: the mapping holds the old one."""
        if self.fd is not None:
            now = os.fstat(self.fd)
        else:
            try:
                now = os.stat(self.path)
            except OSError:
                return
            if (now.st_dev, now.st_ino) != (self.stat.st_dev, self.stat.st_ino):
                return
        if self._identity(now) != self._identity(self.stat):
            raise ModelLoadError(f"{self.path} changed since it was loaded: load it again")

    def copy_source(self) -> tuple[int, bool] | None:
        """(a descriptor of the file as loaded, whether the caller closes it) for a copy in the
        kernel; None when only the mapping still holds those bytes."""
        if self.fd is not None:
            return self.fd, False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        if self._identity(os.fstat(fd)) == self._identity(self.stat):
            return fd, True
        os.close(fd)
        return None


@dataclass(frozen=True)
class FileRange:
    """`length` bytes at `offset` of an open file, as a writer copies them: in the kernel, holes kept."""

    file: DataFile
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length

    def read(self) -> memoryview:
        return memoryview(self.file.read(self.offset, self.length, np.dtype(np.uint8)))

    def view(self) -> memoryview | None:
        """The bytes in the mapping, without a copy (None: the file is not mapped)."""
        m = self.file.map
        return None if m is None else memoryview(m)[self.offset:self.offset + self.length]


class Buffer:
    """Weights inside bytes the caller gave: views of them (read-only), copies where unaligned."""

    def __init__(self, data):
        self.data = data

    def read(self, offset: int, length: int, dtype: np.dtype) -> np.ndarray:
        arr = np.frombuffer(self.data, dtype=np.uint8, count=length, offset=offset)
        return arr.view(dtype) if offset % dtype.itemsize == 0 else arr.copy().view(dtype)


@dataclass(frozen=True)
class Span:
    """Where an initializer's bytes lie: `length` bytes at `offset` of `source`."""

    source: DataFile | Buffer
    offset: int
    length: int


def expected_bytes(proto: TensorProto) -> int | None:
    """The bytes an initializer's shape and element type need (None: a type without a fixed size)."""
    count = 1
    for d in proto.dims:
        count *= d
    if proto.data_type in BITS:
        return (count * BITS[proto.data_type] + 7) // 8
    try:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type)).itemsize
    except Exception:  # STRING, UNDEFINED, an unknown number
        return None


def describe(proto: TensorProto) -> str:
    try:
        kind = TensorProto.DataType.Name(proto.data_type).lower()
    except ValueError:
        kind = f"type {proto.data_type}"
    return f"shape {list(proto.dims)} {kind}"


class Weights(Mapping[str, np.ndarray]):
    """Initializer name -> value (read-only numpy array), read on first use and kept.

    `spans` says where the tensors without their bytes in the proto keep them; the others (small
    tensors, or typed fields such as float_data) are converted from the proto.
    """

    def __init__(self, protos: Mapping[str, TensorProto], spans: Mapping[str, Span] | None = None):
        self._protos = protos
        self._spans = dict(spans or {})
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        arr = self.array(name)
        if arr.flags.writeable:
            arr = arr.view()
            arr.flags.writeable = False
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)

    def __contains__(self, name) -> bool:
        return name in self._protos

    def detached(self) -> frozenset[str]:
        """The initializers whose bytes are not in the proto (in the file or in external data)."""
        return frozenset(self._spans)

    def require_unchanged(self) -> None:
        """ModelLoadError when a file the weights are read from changed since the load."""
        for source in {id(s.source): s.source for s in self._spans.values()}.values():
            if isinstance(source, DataFile):
                source.require_unchanged()

    def nbytes(self, name: str) -> int:
        span = self._spans.get(name)
        return span.length if span is not None else (expected_bytes(self._protos[name]) or 0)

    def total_bytes(self) -> int:
        return sum(self.nbytes(n) for n in self._protos)

    def stored(self, name: str) -> FileRange | memoryview | None:
        """The stored little-endian bytes of a detached initializer, for writing the model back: the
        file range they lie in, or a view of the bytes the caller gave (None: they are in the proto)."""
        span = self._spans.get(name)
        if span is None:
            return None
        if isinstance(span.source, DataFile):
            return FileRange(span.source, span.offset, span.length)
        return memoryview(span.source.read(span.offset, span.length, np.dtype(np.uint8)))

    def array(self, name: str) -> np.ndarray:
        """The value, writable where its memory is private (a mapping's copy-on-write pages, a read)."""
        arr = self._arrays.get(name)
        if arr is None:
            arr = self._arrays[name] = self._load(name)
        return arr

    def _plain(self, name: str) -> bool:
        return self._protos[name].data_type not in PACKED and sys.byteorder == "little"

    def _load(self, name: str) -> np.ndarray:
        proto = self._protos[name]
        span = self._spans.get(name)
        try:
            if span is None:
                return numpy_helper.to_array(proto)
            if not self._plain(name):  # packed or byte-swapped types: numpy_helper knows them
                full = TensorProto()
                full.CopyFrom(proto)
                full.ClearField("external_data")
                full.data_location = TensorProto.DEFAULT
                full.raw_data = span.source.read(span.offset, span.length, np.dtype(np.uint8)).tobytes()
                return numpy_helper.to_array(full)
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type))
            return span.source.read(span.offset, span.length, dtype).reshape(tuple(proto.dims))
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"cannot read initializer {name!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}") \
                from None
