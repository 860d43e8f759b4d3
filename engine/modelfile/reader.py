"""Reading a model without its weights (writing one back: engine/modelfile/writer.py).

`read` gives the model's *skeleton* (the ModelProto with every initializer of a kilobyte or more
stripped of its bytes: what protobuf parses, the checker checks and shape inference reads) and a
`Weights` that knows where those bytes are: in the .onnx file (protobuf never sees them; see
engine/modelfile/protowire.py) or in external data files, opened through onnx's own path checks and mapped.
`checkable` is the skeleton as the checker and shape inference can take it.
"""
from __future__ import annotations

import mmap
import os

import onnx
from onnx import ModelProto, TensorProto, helper

from ..errors import ModelLoadError
from . import protowire
from .index import GraphIndex, index
from .text import require_text
from .weights import Buffer, DataFile, Span, Weights, describe, expected_bytes

STRIP_BYTES = 1024  # smaller initializers stay in the proto: shape inference reads the shape-like ones
# External data files are memory-mapped; ONNXGRAD_MMAP=0 reads each tensor into memory of its own
# instead (as llama.cpp's --no-mmap: for filesystems where mapping is slow, or files that may change).
MAP_EXTERNAL = os.environ.get("ONNXGRAD_MMAP", "1") != "0"


def resolve_path(path: str) -> str:
    """`path`, or the one .onnx file in the folder `path` (as optimum exports a model)."""
    if not os.path.isdir(path):
        return path
    found = sorted(f for f in os.listdir(path) if f.lower().endswith(".onnx") and os.path.isfile(os.path.join(path, f)))
    if len(found) == 1:
        return os.path.join(path, found[0])
    if not found:
        raise ModelLoadError(f"{path} is a folder with no .onnx file in it")
    listed = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    raise ModelLoadError(f"{path} holds {len(found)} .onnx files ({listed}): name one")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read(source) -> tuple[ModelProto, Weights, str | None]:
    """(skeleton, weights, path or None) of a path, bytes or ModelProto. The caller's proto and bytes
    are not changed; their weights are shared where they can be (bytes) or copied once (a proto)."""
    if isinstance(source, ModelProto):
        skeleton, spans = _split_proto(source)
        return skeleton, _weights(skeleton, spans, base_dir=""), None
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source) if not isinstance(source, bytes) else source
        skeleton, spans = _read_buffer(data, Buffer(data), what="ONNX bytes", prefix="cannot parse ONNX bytes")
        return skeleton, _weights(skeleton, spans, base_dir=""), None
    path = resolve_path(os.fspath(source))
    if not os.path.exists(path):
        raise ModelLoadError(f"no such file: {path}")
    if os.path.getsize(path) == 0:
        raise ModelLoadError(f"{path} is empty: not an ONNX model")
    fd = os.open(path, os.O_RDONLY)
    try:
        model_file = DataFile(path, fd, mapped=False)  # owns fd from here
    except BaseException:
        os.close(fd)
        raise
    scan = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        skeleton, spans = _read_buffer(scan, model_file, what=path, prefix=f"cannot read {path} as ONNX")
    finally:
        try:
            scan.close()
        except BufferError:  # a fallback's exception still holds a view; the collector closes it
            pass
    return skeleton, _weights(skeleton, spans, base_dir=os.path.dirname(path)), path


def _read_buffer(buf, source, what: str, prefix: str) -> tuple[ModelProto, dict[str, Span]]:
    model = ModelProto()
    try:
        pieces, payloads = protowire.strip_raw_data(buf, len(buf), STRIP_BYTES)
        skeleton = b"".join(pieces)
        del pieces
        model.ParseFromString(skeleton)
    except Exception:  # noqa: BLE001 - any layout the scan does not follow: protobuf parses it, or says why
        try:
            model = onnx.load_model_from_string(bytes(buf))
        except Exception as exc:
            raise ModelLoadError(f"{prefix}: {first_line(exc)}") from None
        return _split_proto(model, take=True)
    inits = model.graph.initializer
    spans = {}
    for p in payloads:
        spans[inits[p.ordinal].name] = Span(source, p.offset, p.length)
    return model, spans


def _copy_fields(src, dst, skip: frozenset = frozenset()) -> None:
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        try:
            if fd.is_repeated:
                getattr(dst, fd.name).extend(value)
            elif fd.message_type is not None:
                getattr(dst, fd.name).CopyFrom(value)
            else:
                setattr(dst, fd.name, value)
        except UnicodeDecodeError:  # a string that is not UTF-8 comes out as bytes; only parsing takes it back
            tag = protowire.encode_varint(fd.number << 3 | protowire.LENGTH_DELIMITED)
            for v in (value if fd.is_repeated else [value]):
                v = v if isinstance(v, bytes) else v.encode()
                dst.MergeFromString(tag + protowire.encode_varint(len(v)) + v)


def _split_proto(proto: ModelProto, take: bool = False) -> tuple[ModelProto, dict[str, Span]]:
    """A skeleton of `proto` and its big raw_data as spans of bytes taken out once (protobuf hands
    raw_data out as a copy: nothing can share it). `take`: the proto is ours, and becomes the skeleton."""
    require_text(proto)
    skeleton = proto if take else ModelProto()
    if not take:
        _copy_fields(proto, skeleton, frozenset({"graph"}))
        if not proto.HasField("graph"):
            return skeleton, {}
        _copy_fields(proto.graph, skeleton.graph, frozenset({"initializer"}))
    spans = {}
    for t in proto.graph.initializer:
        data = t.raw_data if t.HasField("raw_data") else b""
        big = len(data) >= STRIP_BYTES
        if take:
            if big:
                t.ClearField("raw_data")
        else:
            _copy_fields(t, skeleton.graph.initializer.add(), frozenset({"raw_data"}) if big else frozenset())
        if big:
            spans[t.name] = Span(Buffer(data), 0, len(data))
    return skeleton, spans


def _weights(skeleton: ModelProto, spans: dict[str, Span], base_dir: str) -> Weights:
    require_text(skeleton)  # before anything reads a name
    protos = {t.name: t for t in skeleton.graph.initializer}
    files: dict[str, DataFile] = {}
    for name, t in protos.items():
        if t.data_location == TensorProto.EXTERNAL:
            spans[name] = _external_span(t, base_dir, files)
        elif name not in spans:
            continue
        expected = expected_bytes(t)
        if expected is not None and expected != spans[name].length:
            raise ModelLoadError(f"initializer {name!r} holds {spans[name].length} bytes but its {describe(t)} "
                                 f"needs {expected}")
    _load_nested_external(skeleton.graph, base_dir, top=True)
    return Weights(protos, spans)


def _external_span(t: TensorProto, base_dir: str, files: dict[str, DataFile]) -> Span:
    info = {e.key: e.value for e in t.external_data}
    name = t.name
    location = info.get("location")
    if not location:
        raise ModelLoadError(f"initializer {name!r} says its data is external but names no location")
    try:
        offset = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise ModelLoadError(f"initializer {name!r}: external data offset/length {info.get('offset')!r}/"
                             f"{info.get('length')!r} are not numbers") from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelLoadError(f"initializer {name!r}: negative external data offset or length")
    data = files.get(location)
    if data is None:
        data = files[location] = DataFile(os.path.join(base_dir, location), _open_external(base_dir, location, name),
                                          mapped=MAP_EXTERNAL)
    if length is None:
        length = max(data.size - offset, 0)
    if offset + length > data.size:
        raise ModelLoadError(f"initializer {name!r} needs {length} bytes at offset {offset} of {location}, "
                             f"which holds {data.size}: the file is truncated or not this model's")
    return Span(data, offset, length)


def _open_external(base_dir: str, location: str, name: str) -> int:
    """A read-only descriptor for `location`, refused outside `base_dir`, through a symlink or when
    missing (onnx's own checks where this onnx has them)."""
    try:
        from onnx.onnx_cpp2py_export import checker as c_checker

        opener = c_checker._open_external_data
    except (ImportError, AttributeError):
        opener = None
    try:
        if opener is not None:
            return opener(base_dir, location, name, True)
        return _open_checked(base_dir, location, name)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(first_line(exc)) from None


def _open_checked(base_dir: str, location: str, name: str) -> int:
    path = os.path.join(base_dir, location)
    if os.path.isabs(location):
        raise ModelLoadError(f"external data of {name!r} must be a relative path, not {location}")
    base = os.path.realpath(base_dir or ".")
    if os.path.commonpath([base, os.path.realpath(path)]) != base:
        raise ModelLoadError(f"external data of {name!r} ({location}) points outside {base}")
    if os.path.islink(path):
        raise ModelLoadError(f"external data of {name!r} ({path}) is a symbolic link")
    if not os.path.isfile(path):
        raise ModelLoadError(f"external data of {name!r} should be in {path}, which is not a file")
    return os.open(path, os.O_RDONLY)


def _load_nested_external(graph, base_dir: str, top: bool) -> None:
    """Tensors of attributes and subgraphs with external data are read into the proto (they are small)."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    tensors = [] if top else list(graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                tensors.append(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                tensors.extend(a.tensors)
            elif a.type == onnx.AttributeProto.GRAPH:
                _load_nested_external(a.g, base_dir, top=False)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _load_nested_external(g, base_dir, top=False)
    for t in tensors:
        if uses_external_data(t):
            try:
                load_external_data_for_tensor(t, base_dir)
            except Exception as exc:
                raise ModelLoadError(f"cannot read the external data of tensor {t.name!r}: {first_line(exc)}") from None


def checkable(model: ModelProto, detached) -> ModelProto:
    """A copy of `model` the checker and shape inference take without the weights: each initializer
    whose bytes are elsewhere becomes a graph input of its type and shape (its size is checked by `read`)."""
    if not detached:
        return model
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inputs = {i.name for i in g.input}
    kept = [t for t in g.initializer if t.name not in detached]
    moved = [t for t in g.initializer if t.name in detached]
    del g.initializer[:]
    g.initializer.extend(kept)
    for t in moved:
        if t.name not in inputs:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            inputs.add(t.name)
    return out


def _check(model: ModelProto) -> None:
    """onnx's checker on `model` (without its weights: `modelfile.checkable`), except that onnxruntime's
    default-domain contrib ops (SimplifiedLayerNormalization, LayerNormalization below opset 17, which
    its optimizer writes) are checked as custom-domain nodes."""
    runtime_ops = _default_domain_contrib_nodes(model)
    hidden = "onnxgrad.onnxruntime"
    original = [node.domain for node in runtime_ops]
    if runtime_ops:
        for node in runtime_ops:
            node.domain = hidden
        model.opset_import.add(domain=hidden, version=1)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ModelLoadError(f"ONNX checker rejected the model: {first_line(exc)}") from None
    finally:
        if runtime_ops:
            for node, domain in zip(runtime_ops, original):
                node.domain = domain
            del model.opset_import[len(model.opset_import) - 1]


def _default_domain_contrib_nodes(model: ModelProto) -> list:
    from .contrib_schema import DEFAULT_DOMAIN_OPS, is_default_domain_contrib

    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)
    found = []

    def walk(graph):
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type in DEFAULT_DOMAIN_OPS \
                    and is_default_domain_contrib(node.op_type, opset):
                found.append(node)
            for attr in node.attribute:
                if attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return found


# (op type, attribute) -> (node, value) that onnx's shape inference indexes with unchecked, crashing the process
# (onnx 1.23: GatherND's batch_dims of -2^31 and LayerNormalization's axis of 2^31 segfault, a Split whose
# num_outputs is not its output count aborts); found by tests/attribute_fuzz.py
INFERENCE_HAZARDS = {
    ("GatherND", "batch_dims"): lambda node, v: v < 0,
    ("LayerNormalization", "axis"): lambda node, v: not -1024 <= v <= 1024,
    ("Split", "num_outputs"): lambda node, v: v != len(node.output),
}


# Expand-8's shape inference makes one output dim per element its shape input declares, however many (2^40:
# a hang, found by benchmarks/fuzz_models.py); no tensor has that many dims
LONGEST_SHAPE = 1024


def crashes_inference(graph) -> bool:
    lengths = None
    for node in graph.node:
        if node.op_type == "Expand" and len(node.input) > 1:
            lengths = _declared_lengths(graph) if lengths is None else lengths
            if lengths.get(node.input[1], 0) > LONGEST_SHAPE:
                return True
        for attr in node.attribute:
            hazard = INFERENCE_HAZARDS.get((node.op_type, attr.name))
            if hazard is not None and attr.type == onnx.AttributeProto.INT and hazard(node, attr.i):
                return True
            if (attr.g.node and crashes_inference(attr.g)) or any(crashes_inference(g) for g in attr.graphs):
                return True
    return False


def _declared_lengths(graph) -> dict[str, int]:
    """The declared length of each 1-D value the graph types (inputs, value_info, initializers)."""
    out = {t.name: t.dims[0] for t in graph.initializer if len(t.dims) == 1}
    for vi in (*graph.input, *graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value"):
            out[vi.name] = dims[0].dim_value
    return out


def read_graph(source: str | os.PathLike | ModelProto | bytes, *, check: bool = True) -> GraphIndex:
    """Read a model (path, folder holding one .onnx, bytes or proto), check it, infer shapes where
    possible and index it. The checker and shape inference see the model without its weights; the
    weights stay where they are (`GraphIndex.weights`) until something reads them."""
    skeleton, weights, path = read(source)
    if not skeleton.HasField("graph") and skeleton.ir_version == 0:  # protobuf parses b"" and some text "fine"
        raise ModelLoadError(f"{path or 'the model'} holds no graph and no ir_version: not an ONNX model")
    bare = checkable(skeleton, weights.detached())
    if check:
        _check(bare)
    model = ModelProto()
    model.CopyFrom(skeleton)
    try:  # best effort: shapes only inform messages and the explorer
        if crashes_inference(bare.graph):
            raise ValueError("onnx's shape inference would crash the process: run-time checks name the attribute")
        inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False)
        model.graph.value_info.extend(inferred.graph.value_info)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
    except Exception:  # noqa: BLE001
        pass
    graph = index(model, path)
    graph.weights = weights
    graph.source = skeleton
    return graph
